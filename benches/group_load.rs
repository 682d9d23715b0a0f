//! How long the group coordinator takes to reload committed offsets at start-up.
//!
//! Commits `GROUPS × PARTITIONS` offsets (1M by default) with OffsetCommit
//! requests on the wire, shuts the broker down cleanly, starts it again on the
//! same directory and measures the time from `Broker::start` until every
//! `__consumer_offsets` shard has loaded. Also reports the commit throughput.
//!
//! `cargo bench --bench group_load` (env GROUPS, PARTITIONS to change the size).

#[path = "../tests/common/mod.rs"]
mod common;

use std::time::{Duration, Instant};

use common::*;
use kafka_protocol::messages::offset_commit_request::{OffsetCommitRequestPartition, OffsetCommitRequestTopic};
use kafka_protocol::messages::{GroupId, OffsetCommitRequest, TopicName};
use kafka_protocol::protocol::StrBytes;

fn env_or(name: &str, default: usize) -> usize {
    std::env::var(name).ok().and_then(|v| v.parse().ok()).unwrap_or(default)
}

async fn wait_loaded(broker: &TestBroker) -> Duration {
    let started = Instant::now();
    while !broker.handle.state().groups().all_loaded() {
        assert!(started.elapsed() < Duration::from_secs(600), "coordinator did not load within 10 minutes");
        tokio::time::sleep(Duration::from_millis(1)).await;
    }
    started.elapsed()
}

fn main() {
    let groups = env_or("GROUPS", 10_000);
    let partitions = env_or("PARTITIONS", 100);
    let runtime = tokio::runtime::Builder::new_multi_thread().enable_all().build().unwrap();
    runtime.block_on(async move {
        let overrides = ["log.cleaner.enable=false"];
        let broker = start_broker(&overrides).await;
        create_topic(&broker.bootstrap(), "bench", partitions as i32, &[]).await;
        let mut conn = RawConn::connect(broker.addr()).await;
        let started = Instant::now();
        for g in 0..groups {
            let parts = (0..partitions as i32)
                .map(|p| OffsetCommitRequestPartition::default().with_partition_index(p).with_committed_offset(g as i64 * 7 + p as i64))
                .collect();
            let req = OffsetCommitRequest::default()
                .with_group_id(GroupId(StrBytes::from_string(format!("group-{g}"))))
                .with_generation_id_or_member_epoch(-1)
                .with_topics(vec![OffsetCommitRequestTopic::default()
                    .with_name(TopicName(StrBytes::from_static_str("bench")))
                    .with_partitions(parts)]);
            let resp = conn.call(&req, 8).await;
            assert!(resp.topics[0].partitions.iter().all(|p| p.error_code == 0), "commit failed");
        }
        let commit_elapsed = started.elapsed();
        let total = groups * partitions;
        println!(
            "committed {total} offsets ({groups} groups x {partitions} partitions) in {:.2} s: {:.0} offsets/s",
            commit_elapsed.as_secs_f64(),
            total as f64 / commit_elapsed.as_secs_f64()
        );
        let dir = broker.shutdown().await;
        let started = Instant::now();
        let broker = start_broker_in(dir, &overrides).await;
        let start_elapsed = started.elapsed();
        let load_elapsed = wait_loaded(&broker).await;
        println!(
            "restart: Broker::start returned in {} ms; all __consumer_offsets shards loaded {} ms after that ({:.0} offsets/s)",
            start_elapsed.as_millis(),
            load_elapsed.as_millis(),
            total as f64 / (start_elapsed + load_elapsed).as_secs_f64()
        );
        broker.shutdown().await;
    });
}
