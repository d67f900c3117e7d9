//! `corral run`: the start-up sequence (logging, the runtime, the listeners bound, the
//! signals turned into the shutdown token) and serving until a stop.

use std::path::PathBuf;

use crate::config::{self, Config, ConfigError};
use crate::error::Error;
use crate::signals::Control;

use super::load;

/// Serves `config` until a stop signal: logging to stderr, a multi-threaded runtime, the
/// listeners bound, signals translated into the shutdown token.
pub(super) fn serve(
    config: &Config,
    path: Option<PathBuf>,
    missing: &[ConfigError],
) -> Result<(), Error> {
    init_logging(config.server.log_level);
    for e in missing {
        for line in e.to_string().trim_end().lines() {
            tracing::error!("{line}");
        }
    }
    // Before the runtime starts its threads and before anything is created.
    crate::process::own::restrict_umask();
    let inherited = crate::process::own::cloexec_inherited().map_err(|source| Error::Io {
        what: "mark inherited descriptors close-on-exec".to_owned(),
        source,
    })?;
    if inherited > 0 {
        tracing::debug!(
            count = inherited,
            "inherited descriptors marked close-on-exec: workers will not get them"
        );
    }
    let root = nix::unistd::Uid::effective().is_root();
    crate::runtime_dir::prepare(
        &config.server.runtime_dir,
        crate::runtime_dir::mode_for(config, root),
    )?;
    // Held for as long as corral serves: `corral stop`, `restart-workers` and `status` find
    // this process through it.
    let pid_path = crate::control::pid_path(config);
    let _pid_file =
        crate::control::PidFile::create(&pid_path).map_err(|source| Error::Unavailable {
            what: format!("the pid file {}", pid_path.display()),
            source,
        })?;
    // Before anything is bound or spawned: each front connection is a descriptor, and a
    // 1,024 soft limit is a few hundred idle sockets away from refusing everything.
    // Workers get the limit corral was started with back.
    let worker_nofile = match crate::process::rlimit::raise_nofile() {
        Ok(r) => {
            tracing::info!(
                old = r.old_soft,
                new = r.new_soft,
                hard = r.hard,
                "raised the soft file-descriptor limit (RLIMIT_NOFILE)"
            );
            (r.new_soft != r.old_soft).then_some(r.old_soft)
        }
        Err(e) => {
            tracing::warn!(error = %e, "cannot raise the file-descriptor limit (RLIMIT_NOFILE)");
            None
        }
    };
    // Sockets handed over by socket activation (LISTEN_FDS), taken before anything else
    // could open descriptors or the runtime starts.
    let inherited = crate::systemd::listen_fds();
    let mut builder = tokio::runtime::Builder::new_multi_thread();
    let threads = crate::app::serving_threads(config);
    match config.server.scheduler {
        // The serving threads are started by `app::run`; this runtime only carries the
        // control plane (drivers, reloads, signals, status).
        config::Scheduler::PerThread => {
            builder.worker_threads(1);
            let sched_batch = config.serving_sched_batch();
            tracing::info!(
                threads,
                scheduler = "per-thread",
                sched_batch,
                "serving threads"
            );
        }
        config::Scheduler::WorkStealing => {
            builder.worker_threads(threads);
            tracing::info!(
                threads,
                scheduler = "work-stealing",
                "runtime worker threads"
            );
        }
    }
    let runtime = builder.enable_all().build().map_err(|source| Error::Io {
        what: "start the runtime".to_owned(),
        source,
    })?;
    runtime.block_on(async {
        let listeners = crate::app::bind_all(config, inherited).map_err(|source| Error::Io {
            what: "bind the listeners".to_owned(),
            source,
        })?;
        let mut controls = crate::signals::listen().map_err(|source| Error::Io {
            what: "listen for signals".to_owned(),
            source,
        })?;
        let shutdown = tokio_util::sync::CancellationToken::new();
        let stopper = shutdown.clone();
        let fast = tokio_util::sync::CancellationToken::new();
        let fast_stopper = fast.clone();
        let (app, app_controls) = tokio::sync::mpsc::channel(4);
        tokio::spawn(async move {
            while let Some(control) = controls.recv().await {
                match control {
                    Control::GracefulStop => {
                        tracing::info!(?control, "stop requested");
                        stopper.cancel();
                    }
                    Control::FastStop => {
                        tracing::info!(?control, "fast stop requested");
                        fast_stopper.cancel();
                        stopper.cancel();
                    }
                    Control::Upgrade => {
                        tracing::info!(?control, "rolling restart of the workers requested");
                        let _ = app.try_send(crate::app::AppControl::RestartWorkers);
                    }
                    Control::ReopenLogs => {
                        tracing::info!(?control, "reopening the request logs");
                        let _ = app.try_send(crate::app::AppControl::ReopenLogs);
                    }
                    Control::Reload => {
                        tracing::info!(?control, "reload requested: reading the configuration again");
                        // Read and validated off the runtime's threads; every error is logged
                        // with its file:line:column and the running configuration stays.
                        let path = path.clone();
                        let read = tokio::task::spawn_blocking(move || load(path.as_deref())).await;
                        match read {
                            Ok(Ok(new)) => {
                                let _ = app.send(crate::app::AppControl::Reload(Box::new(new))).await;
                            }
                            Ok(Err(e)) => {
                                for line in e.to_string().trim_end().lines() {
                                    tracing::error!("{line}");
                                }
                                let first = e.to_string().lines().next().unwrap_or_default().to_owned();
                                let reason = format!("the configuration has errors: {first}");
                                let _ = app.send(crate::app::AppControl::ReloadRefused(reason)).await;
                            }
                            Err(e) => {
                                tracing::error!(error = %e, "reload: reading the configuration failed");
                                let reason = format!("reading the configuration failed: {e}");
                                let _ = app.send(crate::app::AppControl::ReloadRefused(reason)).await;
                            }
                        }
                    }
                }
            }
        });
        crate::app::run(
            config,
            listeners,
            shutdown,
            fast,
            worker_nofile,
            app_controls,
        )
        .await
        .map_err(Error::Startup)
    })
}

fn init_logging(level: config::LogLevel) {
    let max = match level {
        config::LogLevel::Error => tracing::Level::ERROR,
        config::LogLevel::Warn => tracing::Level::WARN,
        config::LogLevel::Info => tracing::Level::INFO,
        config::LogLevel::Debug => tracing::Level::DEBUG,
        config::LogLevel::Trace => tracing::Level::TRACE,
    };
    // A second call (tests run several commands in one process) keeps the first subscriber.
    // A line that cannot be written is dropped without a word: the subscriber would report
    // it with eprintln!, which panics when stderr is a pipe nobody reads any more (a logger
    // that died), and that panic would take down the task that logged, a request's or the
    // shutdown's.
    let _ = tracing_subscriber::fmt()
        .with_max_level(max)
        .with_writer(std::io::stderr)
        .with_ansi(false)
        .log_internal_errors(false)
        .try_init();
}
