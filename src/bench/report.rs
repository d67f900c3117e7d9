//! The results as people and programs read them: an ab-like table (one row per run, then a
//! summary and the ratios to the first target when comparing) and JSON, written by hand.

use std::fmt::Write;

use super::load::{Run, TargetResult};
use super::procs::Usage;
use super::BenchArgs;

/// The lines above the first row: what is measured, then the column names.
pub(super) fn header(args: &BenchArgs, rounds: usize) -> String {
    let what = match args.requests {
        Some(n) => format!("{n} requests per run"),
        None => format!("{} per run", humantime::format_duration(args.duration)),
    };
    let kept = args.keepalive == super::Switch::On && args.protocol != super::Protocol::Scgi;
    let keep = if kept {
        "kept connections"
    } else {
        "a connection per request"
    };
    format!(
        "corral bench: {} {} {}, {what}, {rounds} round{}, warm-up {}, {keep}\n{}",
        args.protocol.name(),
        args.method,
        args.path,
        if rounds == 1 { "" } else { "s" },
        humantime::format_duration(args.warmup),
        columns(label_width(args, rounds))
    )
}

/// Width of the target column: the longest label, with room for a round number.
pub(super) fn label_width(args: &BenchArgs, rounds: usize) -> usize {
    let round_tag = if rounds > 1 {
        3 + rounds.to_string().len()
    } else {
        0
    };
    std::iter::once(&args.target)
        .chain(&args.compare)
        .map(|a| super::address_label(a).len() + round_tag)
        .fold(6, usize::max)
}

fn columns(width: usize) -> String {
    format!(
        "{:<width$} {:>5} {:>9} {:>10} {:>8} {:>8} {:>8} {:>8} {:>9} {:>7} {:>10}",
        "target",
        "c",
        "requests",
        "req/s",
        "p50 us",
        "p90 us",
        "p99 us",
        "p99.9",
        "max us",
        "errors",
        "body bytes"
    )
}

/// One run, or the merge of several.
pub(super) fn row(label: &str, run: &Run, width: usize) -> String {
    let l = &run.latency;
    let mut line = format!(
        "{:<width$} {:>5} {:>9} {:>10.0} {:>8} {:>8} {:>8} {:>8} {:>9} {:>7} {:>10}",
        label,
        run.concurrency,
        run.completed,
        run.rate(),
        l.value_at_quantile(0.5),
        l.value_at_quantile(0.9),
        l.value_at_quantile(0.99),
        l.value_at_quantile(0.999),
        l.max(),
        run.errors.total(),
        run.body_bytes
    );
    let e = &run.errors;
    if e.total() > 0 {
        let _ = write!(
            line,
            "\n    errors: connect {}, protocol {}, non-2xx {}, timeout {}",
            e.connect, e.protocol, e.status, e.timeout
        );
    }
    for p in &run.procs {
        let _ = write!(line, "\n    pid {}: {}", p.pid, usage(p));
    }
    if let Some(g) = &run.generator {
        let _ = write!(line, "\n    corral bench itself: {}", usage(g));
    }
    line
}

fn usage(p: &Usage) -> String {
    let cpu = p
        .cpu_percent
        .map_or_else(|| "?".to_owned(), |c| format!("{c:.1}%"));
    let rss = p.rss_kib_max.map_or_else(
        || "?".to_owned(),
        |k| format!("{:.1} MiB", k as f64 / 1024.0),
    );
    format!("cpu {cpu} of a core, max rss {rss}")
}

/// The merged rows when there were several rounds, and the ratios of each compared target
/// to the first.
pub(super) fn summary(results: &[TargetResult], rounds: usize, width: usize) -> String {
    let mut text = String::new();
    if rounds > 1 {
        let _ = writeln!(text, "\nall {rounds} rounds together:\n{}", columns(width));
        for target in results {
            for run in &target.runs {
                let _ = writeln!(text, "{}", row(&target.label, run, width));
            }
        }
    }
    if let Some((base, others)) = results.split_first() {
        for other in others {
            for (a, b) in base.runs.iter().zip(&other.runs) {
                let _ = writeln!(
                    text,
                    "ratio {} / {} at c={}: req/s {:.3}, p50 {:.3}, p99 {:.3}",
                    other.label,
                    base.label,
                    a.concurrency,
                    ratio(b.rate(), a.rate()),
                    ratio(
                        b.latency.value_at_quantile(0.5) as f64,
                        a.latency.value_at_quantile(0.5) as f64
                    ),
                    ratio(
                        b.latency.value_at_quantile(0.99) as f64,
                        a.latency.value_at_quantile(0.99) as f64
                    ),
                );
            }
        }
    }
    text.trim_end().to_owned()
}

fn ratio(a: f64, b: f64) -> f64 {
    if b > 0.0 {
        a / b
    } else {
        f64::NAN
    }
}

/// The results as one JSON object.
pub(super) fn json(args: &BenchArgs, results: &[TargetResult]) -> String {
    let mut j = String::new();
    let _ = write!(
        j,
        "{{\"protocol\":{},\"method\":{},\"path\":{},\"keepalive\":{},",
        string(args.protocol.name()),
        string(&args.method),
        string(&args.path),
        args.keepalive == super::Switch::On
    );
    match args.requests {
        Some(n) => {
            let _ = write!(j, "\"requests_per_run\":{n},");
        }
        None => {
            let _ = write!(j, "\"duration_s\":{},", number(args.duration.as_secs_f64()));
        }
    }
    j.push_str("\"targets\":[");
    for (i, target) in results.iter().enumerate() {
        if i > 0 {
            j.push(',');
        }
        let _ = write!(j, "{{\"target\":{},\"levels\":[", string(&target.label));
        for (k, run) in target.runs.iter().enumerate() {
            if k > 0 {
                j.push(',');
            }
            run_json(&mut j, run);
        }
        j.push_str("]}");
    }
    j.push_str("]}\n");
    j
}

fn run_json(j: &mut String, run: &Run) {
    let l = &run.latency;
    let e = &run.errors;
    let _ = write!(
        j,
        "{{\"concurrency\":{},\"completed\":{},\"elapsed_s\":{},\"req_per_s\":{},\
         \"latency_us\":{{\"p50\":{},\"p90\":{},\"p99\":{},\"p99_9\":{},\"max\":{},\"mean\":{}}},\
         \"errors\":{{\"connect\":{},\"protocol\":{},\"status\":{},\"timeout\":{}}},\
         \"body_bytes\":{},\"processes\":[",
        run.concurrency,
        run.completed,
        number(run.elapsed.as_secs_f64()),
        number(run.rate()),
        l.value_at_quantile(0.5),
        l.value_at_quantile(0.9),
        l.value_at_quantile(0.99),
        l.value_at_quantile(0.999),
        l.max(),
        number(l.mean()),
        e.connect,
        e.protocol,
        e.status,
        e.timeout,
        run.body_bytes
    );
    for (i, p) in run.procs.iter().enumerate() {
        if i > 0 {
            j.push(',');
        }
        usage_json(j, p);
    }
    j.push_str("],\"generator\":");
    match &run.generator {
        Some(g) => usage_json(j, g),
        None => j.push_str("null"),
    }
    j.push('}');
}

fn usage_json(j: &mut String, p: &Usage) {
    let cpu = p.cpu_percent.map_or_else(|| "null".to_owned(), number);
    let rss = p
        .rss_kib_max
        .map_or_else(|| "null".to_owned(), |k| k.to_string());
    let _ = write!(
        j,
        "{{\"pid\":{},\"cpu_percent\":{cpu},\"rss_kib_max\":{rss}}}",
        p.pid
    );
}

/// A JSON number; JSON has no NaN or infinity, so those become null.
fn number(x: f64) -> String {
    if x.is_finite() {
        format!("{x:.3}")
    } else {
        "null".to_owned()
    }
}

/// A JSON string literal.
pub(super) fn string(s: &str) -> String {
    let mut out = String::with_capacity(s.len() + 2);
    out.push('"');
    for c in s.chars() {
        match c {
            '"' => out.push_str("\\\""),
            '\\' => out.push_str("\\\\"),
            c if u32::from(c) < 0x20 => {
                let _ = write!(out, "\\u{:04x}", u32::from(c));
            }
            c => out.push(c),
        }
    }
    out.push('"');
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn strings_and_numbers_are_valid_json() {
        assert_eq!(string("a\"b\\c\n"), "\"a\\\"b\\\\c\\u000a\"");
        assert_eq!(number(f64::NAN), "null");
        assert_eq!(number(1.5), "1.500");
    }
}
