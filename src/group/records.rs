//! The records the group coordinator keeps in `__consumer_offsets`, in
//! Kafka's own key/value schemas so Kafka's tools can read the topic:
//!
//! - key v1 `OffsetCommitKey { group, topic, partition }` →
//!   value v3 `OffsetCommitValue { offset, leader_epoch, metadata, commit_timestamp }`
//! - key v2 `GroupMetadataKey { group }` →
//!   value v3 `GroupMetadataValue { protocol_type, generation, protocol, leader,
//!   current_state_timestamp, members[] }`
//!
//! A null value is a tombstone. Older value versions (0–2) are read too.

use bytes::{BufMut, Bytes, BytesMut};

const OFFSET_KEY_VERSION: i16 = 1;
const GROUP_KEY_VERSION: i16 = 2;
const OFFSET_VALUE_VERSION: i16 = 3;
const GROUP_VALUE_VERSION: i16 = 3;

#[derive(Debug, Clone, PartialEq, Eq)]
pub enum RecordKey {
    Offset { group: String, topic: String, partition: i32 },
    Group { group: String },
}

impl RecordKey {
    pub fn group(&self) -> &str {
        match self {
            RecordKey::Offset { group, .. } | RecordKey::Group { group } => group,
        }
    }
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct OffsetValue {
    pub offset: i64,
    pub leader_epoch: i32,
    pub metadata: String,
    pub commit_timestamp: i64,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct MemberValue {
    pub member_id: String,
    pub group_instance_id: Option<String>,
    pub client_id: String,
    pub client_host: String,
    pub rebalance_timeout_ms: i32,
    pub session_timeout_ms: i32,
    pub subscription: Bytes,
    pub assignment: Bytes,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct GroupValue {
    pub protocol_type: String,
    pub generation: i32,
    pub protocol: Option<String>,
    pub leader: Option<String>,
    pub current_state_timestamp: i64,
    pub members: Vec<MemberValue>,
}

#[derive(Debug, thiserror::Error)]
#[error("malformed __consumer_offsets record: {0}")]
pub struct FormatError(pub String);

fn put_string(buf: &mut BytesMut, s: &str) {
    buf.put_i16(s.len() as i16);
    buf.put_slice(s.as_bytes());
}

fn put_nullable_string(buf: &mut BytesMut, s: Option<&str>) {
    match s {
        Some(s) => put_string(buf, s),
        None => buf.put_i16(-1),
    }
}

fn put_bytes(buf: &mut BytesMut, b: &[u8]) {
    buf.put_i32(b.len() as i32);
    buf.put_slice(b);
}

pub fn encode_key(key: &RecordKey) -> Bytes {
    let mut buf = BytesMut::new();
    match key {
        RecordKey::Offset { group, topic, partition } => {
            buf.put_i16(OFFSET_KEY_VERSION);
            put_string(&mut buf, group);
            put_string(&mut buf, topic);
            buf.put_i32(*partition);
        }
        RecordKey::Group { group } => {
            buf.put_i16(GROUP_KEY_VERSION);
            put_string(&mut buf, group);
        }
    }
    buf.freeze()
}

pub fn encode_offset_value(v: &OffsetValue) -> Bytes {
    let mut buf = BytesMut::new();
    buf.put_i16(OFFSET_VALUE_VERSION);
    buf.put_i64(v.offset);
    buf.put_i32(v.leader_epoch);
    put_string(&mut buf, &v.metadata);
    buf.put_i64(v.commit_timestamp);
    buf.freeze()
}

pub fn encode_group_value(v: &GroupValue) -> Bytes {
    let mut buf = BytesMut::new();
    buf.put_i16(GROUP_VALUE_VERSION);
    put_string(&mut buf, &v.protocol_type);
    buf.put_i32(v.generation);
    put_nullable_string(&mut buf, v.protocol.as_deref());
    put_nullable_string(&mut buf, v.leader.as_deref());
    buf.put_i64(v.current_state_timestamp);
    buf.put_i32(v.members.len() as i32);
    for m in &v.members {
        put_string(&mut buf, &m.member_id);
        put_nullable_string(&mut buf, m.group_instance_id.as_deref());
        put_string(&mut buf, &m.client_id);
        put_string(&mut buf, &m.client_host);
        buf.put_i32(m.rebalance_timeout_ms);
        buf.put_i32(m.session_timeout_ms);
        put_bytes(&mut buf, &m.subscription);
        put_bytes(&mut buf, &m.assignment);
    }
    buf.freeze()
}

/// A bounds-checked big-endian reader: malformed input is an error, never a panic.
struct Reader<'a> {
    buf: &'a [u8],
    pos: usize,
}

impl<'a> Reader<'a> {
    fn new(buf: &'a [u8]) -> Self {
        Reader { buf, pos: 0 }
    }
    fn take(&mut self, n: usize) -> Result<&'a [u8], FormatError> {
        let end =
            self.pos.checked_add(n).filter(|e| *e <= self.buf.len()).ok_or_else(|| FormatError("truncated".into()))?;
        let out = &self.buf[self.pos..end];
        self.pos = end;
        Ok(out)
    }
    fn i16(&mut self) -> Result<i16, FormatError> {
        Ok(i16::from_be_bytes(self.take(2)?.try_into().expect("2 bytes")))
    }
    fn i32(&mut self) -> Result<i32, FormatError> {
        Ok(i32::from_be_bytes(self.take(4)?.try_into().expect("4 bytes")))
    }
    fn i64(&mut self) -> Result<i64, FormatError> {
        Ok(i64::from_be_bytes(self.take(8)?.try_into().expect("8 bytes")))
    }
    fn nullable_string(&mut self) -> Result<Option<String>, FormatError> {
        let len = self.i16()?;
        if len < 0 {
            return Ok(None);
        }
        let bytes = self.take(len as usize)?;
        String::from_utf8(bytes.to_vec()).map(Some).map_err(|_| FormatError("string is not UTF-8".into()))
    }
    fn string(&mut self) -> Result<String, FormatError> {
        self.nullable_string()?.ok_or_else(|| FormatError("null string".into()))
    }
    fn bytes(&mut self) -> Result<Bytes, FormatError> {
        let len = self.i32()?;
        if len < 0 {
            return Ok(Bytes::new());
        }
        Ok(Bytes::copy_from_slice(self.take(len as usize)?))
    }
}

pub fn decode_key(buf: &[u8]) -> Result<RecordKey, FormatError> {
    let mut r = Reader::new(buf);
    match r.i16()? {
        0 | 1 => Ok(RecordKey::Offset { group: r.string()?, topic: r.string()?, partition: r.i32()? }),
        2 => Ok(RecordKey::Group { group: r.string()? }),
        v => Err(FormatError(format!("unknown key version {v}"))),
    }
}

pub fn decode_offset_value(buf: &[u8]) -> Result<OffsetValue, FormatError> {
    let mut r = Reader::new(buf);
    let version = r.i16()?;
    let offset = r.i64()?;
    let leader_epoch = if version >= 3 { r.i32()? } else { -1 };
    let metadata = r.string()?;
    let commit_timestamp = r.i64()?;
    if !(0..=3).contains(&version) {
        return Err(FormatError(format!("unknown offset value version {version}")));
    }
    Ok(OffsetValue { offset, leader_epoch, metadata, commit_timestamp })
}

pub fn decode_group_value(buf: &[u8]) -> Result<GroupValue, FormatError> {
    let mut r = Reader::new(buf);
    let version = r.i16()?;
    if !(0..=3).contains(&version) {
        return Err(FormatError(format!("unknown group value version {version}")));
    }
    let protocol_type = r.string()?;
    let generation = r.i32()?;
    let protocol = r.nullable_string()?;
    let leader = r.nullable_string()?;
    let current_state_timestamp = if version >= 2 { r.i64()? } else { -1 };
    let count = r.i32()?;
    if count < 0 {
        return Err(FormatError("negative member count".into()));
    }
    let mut members = Vec::new();
    for _ in 0..count {
        let member_id = r.string()?;
        let group_instance_id = if version >= 3 { r.nullable_string()? } else { None };
        let client_id = r.string()?;
        let client_host = r.string()?;
        let rebalance_timeout_ms = if version >= 1 { r.i32()? } else { -1 };
        let session_timeout_ms = r.i32()?;
        let rebalance_timeout_ms = if rebalance_timeout_ms < 0 { session_timeout_ms } else { rebalance_timeout_ms };
        let subscription = r.bytes()?;
        let assignment = r.bytes()?;
        members.push(MemberValue {
            member_id,
            group_instance_id,
            client_id,
            client_host,
            rebalance_timeout_ms,
            session_timeout_ms,
            subscription,
            assignment,
        });
    }
    Ok(GroupValue { protocol_type, generation, protocol, leader, current_state_timestamp, members })
}

/// Kafka's choice of `__consumer_offsets` partition for a group:
/// `Utils.abs(groupId.hashCode()) % partitions`, with Java's `String.hashCode`.
pub fn partition_for(group: &str, partitions: i32) -> i32 {
    let mut h: i32 = 0;
    for unit in group.encode_utf16() {
        h = h.wrapping_mul(31).wrapping_add(unit as i32);
    }
    // Kafka's Utils.abs maps Integer.MIN_VALUE to 0.
    let abs = if h == i32::MIN { 0 } else { h.abs() };
    abs % partitions
}

/// The topics a consumer-protocol subscription names (for OffsetDelete's
/// GROUP_SUBSCRIBED_TO_TOPIC check). Returns `None` if it cannot be parsed.
pub fn subscribed_topics(subscription: &[u8]) -> Option<Vec<String>> {
    let mut r = Reader::new(subscription);
    let _version = r.i16().ok()?;
    let count = r.i32().ok()?;
    if count < 0 {
        return None;
    }
    (0..count).map(|_| r.string().ok()).collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn java_string_hash_partitioning() {
        // "".hashCode() = 0; "a".hashCode() = 97; "group".hashCode() = 98629247.
        assert_eq!(partition_for("", 50), 0);
        assert_eq!(partition_for("a", 50), 97 % 50);
        assert_eq!(partition_for("group", 50), 98_629_247 % 50);
        // Negative hash codes use the absolute value: "polygenelubricants".hashCode() = Integer.MIN_VALUE.
        assert_eq!(partition_for("polygenelubricants", 50), 0);
    }

    #[test]
    fn keys_and_values_round_trip_and_garbage_is_an_error() {
        let k = RecordKey::Offset { group: "g".into(), topic: "t".into(), partition: 3 };
        assert_eq!(decode_key(&encode_key(&k)).unwrap(), k);
        let k = RecordKey::Group { group: "g".into() };
        assert_eq!(decode_key(&encode_key(&k)).unwrap(), k);
        let v = OffsetValue { offset: 42, leader_epoch: 7, metadata: "m".into(), commit_timestamp: 1000 };
        assert_eq!(decode_offset_value(&encode_offset_value(&v)).unwrap(), v);
        let g = GroupValue {
            protocol_type: "consumer".into(),
            generation: 5,
            protocol: Some("range".into()),
            leader: Some("m1".into()),
            current_state_timestamp: 99,
            members: vec![MemberValue {
                member_id: "m1".into(),
                group_instance_id: Some("i1".into()),
                client_id: "c".into(),
                client_host: "/127.0.0.1".into(),
                rebalance_timeout_ms: 300_000,
                session_timeout_ms: 45_000,
                subscription: Bytes::from_static(b"sub"),
                assignment: Bytes::from_static(b"asg"),
            }],
        };
        assert_eq!(decode_group_value(&encode_group_value(&g)).unwrap(), g);
        assert!(decode_key(&[0, 1, 0]).is_err());
        assert!(decode_group_value(&[0, 3, 0, 1, b'x', 0, 0, 0, 1, 0xff, 0xff, 0xff, 0xff]).is_err());
    }
}
