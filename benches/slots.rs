//! Slot checkout and return under contention: the per-pool mutex every request takes twice.
//! It informs: whether the slot table is a measurable share of a request (tens of
//! microseconds end to end) and whether it needs to be lock-free before anything else.

#![allow(missing_docs, clippy::expect_used, clippy::unwrap_used)]

use std::sync::Arc;
use std::time::Duration;

use tokio::time::Instant;

use corral::config::BackendAddress;
use corral::pool::slots::{SlotLimits, SlotTable};
use criterion::{criterion_group, criterion_main, BenchmarkId, Criterion, Throughput};

fn table(workers: usize) -> Arc<SlotTable> {
    let t = SlotTable::new(
        SlotLimits {
            max_conns: workers,
            queue_size: 4096,
            queue_timeout: Duration::from_secs(60),
        },
        &[None],
    );
    for i in 0..workers {
        let id = t.add_worker(
            1,
            BackendAddress::Unix(format!("/tmp/w{i}.sock").into()),
            None,
        );
        t.set_accepting(id, true);
    }
    t
}

fn bench_checkout(c: &mut Criterion) {
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .build()
        .unwrap();
    let mut g = c.benchmark_group("slots");
    g.throughput(Throughput::Elements(1));
    // Tasks competing for 4 slots: 1 = uncontended, 16 = most wait in the queue.
    for tasks in [1usize, 4, 16] {
        g.bench_with_input(
            BenchmarkId::new("checkout_return", tasks),
            &tasks,
            |b, &tasks| {
                b.iter_custom(|iters| {
                    let t = table(4);
                    let per_task = (iters as usize).div_ceil(tasks);
                    rt.block_on(async {
                        let start = Instant::now();
                        let handles: Vec<_> = (0..tasks)
                            .map(|_| {
                                let t = Arc::clone(&t);
                                tokio::spawn(async move {
                                    for _ in 0..per_task {
                                        let slot = t.acquire(0).await.expect("a slot");
                                        drop(slot);
                                    }
                                })
                            })
                            .collect();
                        for h in handles {
                            h.await.unwrap();
                        }
                        start.elapsed() * u32::try_from(iters).unwrap_or(u32::MAX)
                            / u32::try_from(per_task * tasks).unwrap_or(u32::MAX)
                    })
                })
            },
        );
    }
    g.finish();
}

criterion_group!(benches, bench_checkout);
criterion_main!(benches);
