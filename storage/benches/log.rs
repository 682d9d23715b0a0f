//! Storage benches: append throughput of 16 KiB batches of 1 KiB records,
//! read throughput (find the slices, then copy them out with `read_into`),
//! and the client batch checks on their own.
//! No fsync in either (flush settings at Kafka's defaults); the numbers are
//! page-cache speed, i.e. the CPU cost of the storage layer.

use std::hint::black_box;

use criterion::{criterion_group, criterion_main, BatchSize, Criterion, Throughput};
use strand_storage::batch::build_test_batch;
use strand_storage::AppendOrigin;
use strand_storage::{Log, LogConfig};

const RECORD_BYTES: usize = 1024;
const RECORDS_PER_BATCH: usize = 16;

fn batch() -> Vec<u8> {
    let value = vec![0x5au8; RECORD_BYTES];
    let values: Vec<&[u8]> = (0..RECORDS_PER_BATCH).map(|_| value.as_slice()).collect();
    build_test_batch(0, 1_700_000_000_000, &values)
}

fn config() -> LogConfig {
    LogConfig { segment_bytes: 64 << 20, ..LogConfig::default() }
}

fn append(c: &mut Criterion) {
    let template = batch();
    let mut group = c.benchmark_group("append");
    group.throughput(Throughput::Bytes(template.len() as u64));
    group.bench_function("16KiB_batch_1KiB_records", |b| {
        let dir = tempfile::tempdir().unwrap();
        let mut log = Log::open(dir.path(), config(), 0).unwrap();
        let mut appended = 0u64;
        b.iter_batched_ref(
            || template.clone(),
            |buf| {
                appended += 1;
                // Keep the directory bounded during long runs.
                if appended.is_multiple_of(4096) {
                    log.truncate_to(0).unwrap();
                }
                black_box(log.append(buf, 0, AppendOrigin::Client, 0).unwrap())
            },
            BatchSize::SmallInput,
        );
    });
    group.finish();
}

fn read(c: &mut Criterion) {
    let template = batch();
    let dir = tempfile::tempdir().unwrap();
    let mut log = Log::open(dir.path(), config(), 0).unwrap();
    let batch_count = 4096i64; // 64 MiB over one or two segments
    for _ in 0..batch_count {
        log.append(&mut template.clone(), 0, AppendOrigin::Client, 0).unwrap();
    }
    let end = log.log_end_offset();
    let mut group = c.benchmark_group("read");
    for (name, max_bytes) in [("one_batch", template.len()), ("1MiB", 1 << 20)] {
        let info = log.read(0, max_bytes, i64::MAX, true).unwrap();
        group.throughput(Throughput::Bytes(info.bytes as u64));
        let mut out = Vec::with_capacity(max_bytes + template.len());
        let mut next = 0i64;
        group.bench_function(format!("{name}_slices_and_read_into"), |b| {
            b.iter(|| {
                // Walk the log at a stride so reads hit different places.
                next = (next + 7 * RECORDS_PER_BATCH as i64 + 3) % (end - 64 * RECORDS_PER_BATCH as i64);
                let info = log.read(next, max_bytes, i64::MAX, true).unwrap();
                out.clear();
                for slice in &info.slices {
                    slice.read_into(&mut out).unwrap();
                }
                black_box(out.len())
            })
        });
        group.bench_function(format!("{name}_slices_only"), |b| {
            b.iter(|| {
                next = (next + 7 * RECORDS_PER_BATCH as i64 + 3) % (end - 64 * RECORDS_PER_BATCH as i64);
                black_box(log.read(next, max_bytes, i64::MAX, true).unwrap().bytes)
            })
        });
    }
    group.finish();
}

/// The cost of Kafka's producer-input checks alone (`check_client_batch`):
/// per batch of 16 uncompressed 1 KiB records, and of 100 100-byte records.
fn client_checks(c: &mut Criterion) {
    let mut group = c.benchmark_group("client_checks");
    let small = vec![0x5au8; 100];
    let smalls: Vec<&[u8]> = (0..100).map(|_| small.as_slice()).collect();
    for (name, b) in [("16x1KiB", batch()), ("100x100B", build_test_batch(0, 1_700_000_000_000, &smalls))] {
        group.bench_function(name, |bench| {
            bench.iter(|| strand_storage::batch::check_client_batch(black_box(&b), 0).unwrap())
        });
    }
    group.finish();
}

criterion_group!(benches, append, read, client_checks);
criterion_main!(benches);
