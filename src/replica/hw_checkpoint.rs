//! `replication-offset-checkpoint`: every hosted partition's high watermark,
//! in Kafka's file format (a version line `0`, a count line, then
//! `topic partition offset` per line), written atomically (temporary file,
//! fsync, rename, fsync of the directory).
//!
//! A restarted replica starts from its checkpointed high watermark rather
//! than 0 (consumers of a new leader see committed data at once) or its log
//! end (which may hold records never committed).

use std::collections::HashMap;
use std::io::Write;
use std::path::Path;

pub const FILE: &str = "replication-offset-checkpoint";

/// The checkpoint's entries; a missing file is empty, a damaged one is
/// reported and treated as empty (high watermarks are then learned again
/// from the leaders: nothing is lost, consumers only wait a fetch longer).
pub fn read(dir: &Path) -> HashMap<(String, i32), i64> {
    let path = dir.join(FILE);
    let text = match std::fs::read_to_string(&path) {
        Ok(t) => t,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return HashMap::new(),
        Err(e) => {
            tracing::warn!(file = %path.display(), error = %e, "cannot read the high-watermark checkpoint; starting from 0");
            return HashMap::new();
        }
    };
    match parse(&text) {
        Ok(entries) => entries,
        Err(e) => {
            tracing::warn!(file = %path.display(), error = %e, "damaged high-watermark checkpoint; starting from 0");
            HashMap::new()
        }
    }
}

fn parse(text: &str) -> Result<HashMap<(String, i32), i64>, String> {
    let mut lines = text.lines();
    if lines.next() != Some("0") {
        return Err("the first line is not version 0".into());
    }
    let count: usize = lines.next().and_then(|l| l.trim().parse().ok()).ok_or("no entry count on line 2")?;
    let mut out = HashMap::with_capacity(count);
    for (i, line) in lines.enumerate() {
        let mut parts = line.split(' ');
        let (Some(topic), Some(p), Some(o), None) = (parts.next(), parts.next(), parts.next(), parts.next()) else {
            return Err(format!("line {} is not `topic partition offset`", i + 3));
        };
        let p: i32 = p.parse().map_err(|_| format!("line {}: bad partition {p:?}", i + 3))?;
        let o: i64 = o.parse().map_err(|_| format!("line {}: bad offset {o:?}", i + 3))?;
        out.insert((topic.to_string(), p), o);
    }
    if out.len() != count {
        return Err(format!("{count} entries announced, {} found", out.len()));
    }
    Ok(out)
}

pub fn write(dir: &Path, entries: &[(String, i32, i64)]) -> std::io::Result<()> {
    let mut text = format!("0\n{}\n", entries.len());
    for (topic, partition, offset) in entries {
        text.push_str(&format!("{topic} {partition} {offset}\n"));
    }
    let temp = dir.join(format!("{FILE}.tmp"));
    let mut f = std::fs::File::create(&temp)?;
    f.write_all(text.as_bytes())?;
    f.sync_all()?;
    std::fs::rename(&temp, dir.join(FILE))?;
    std::fs::File::open(dir)?.sync_all()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn round_trips_and_damage_reads_as_empty() {
        let dir = tempfile::tempdir().unwrap();
        assert!(read(dir.path()).is_empty());
        write(dir.path(), &[("t".into(), 0, 42), ("__consumer_offsets".into(), 7, 3)]).unwrap();
        let got = read(dir.path());
        assert_eq!(got.len(), 2);
        assert_eq!(got[&("t".to_string(), 0)], 42);
        assert_eq!(got[&("__consumer_offsets".to_string(), 7)], 3);
        std::fs::write(dir.path().join(FILE), "0\n2\nt 0 42\n").unwrap();
        assert!(read(dir.path()).is_empty(), "a short file is damage");
    }
}
