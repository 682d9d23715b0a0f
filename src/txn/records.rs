//! `__transaction_state` records in Kafka's schemas: key v0
//! `TransactionLogKey { transactional_id }`, value v0 `TransactionLogValue {
//! producer_id, producer_epoch, transaction_timeout_ms, transaction_status,
//! transaction_partitions[{topic, partition_ids[]}],
//! transaction_last_update_timestamp_ms, transaction_start_timestamp_ms }`.
//! A null value is a tombstone (an expired transactional id).

use bytes::{BufMut, Bytes, BytesMut};

/// Kafka's transaction states, with the codes the log stores.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum TxnState {
    Empty = 0,
    Ongoing = 1,
    PrepareCommit = 2,
    PrepareAbort = 3,
    CompleteCommit = 4,
    CompleteAbort = 5,
    Dead = 6,
    PrepareEpochFence = 7,
}

impl TxnState {
    pub fn from_code(code: i8) -> Option<TxnState> {
        Some(match code {
            0 => TxnState::Empty,
            1 => TxnState::Ongoing,
            2 => TxnState::PrepareCommit,
            3 => TxnState::PrepareAbort,
            4 => TxnState::CompleteCommit,
            5 => TxnState::CompleteAbort,
            6 => TxnState::Dead,
            7 => TxnState::PrepareEpochFence,
            _ => return None,
        })
    }

    /// The names ListTransactions and DescribeTransactions use.
    pub fn name(self) -> &'static str {
        match self {
            TxnState::Empty => "Empty",
            TxnState::Ongoing => "Ongoing",
            TxnState::PrepareCommit => "PrepareCommit",
            TxnState::PrepareAbort => "PrepareAbort",
            TxnState::CompleteCommit => "CompleteCommit",
            TxnState::CompleteAbort => "CompleteAbort",
            TxnState::Dead => "Dead",
            TxnState::PrepareEpochFence => "PrepareEpochFence",
        }
    }
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TxnValue {
    pub producer_id: i64,
    pub producer_epoch: i16,
    pub timeout_ms: i32,
    pub state: TxnState,
    pub partitions: Vec<(String, Vec<i32>)>,
    pub last_update_ms: i64,
    pub start_ms: i64,
}

pub fn encode_key(transactional_id: &str) -> Bytes {
    let mut b = BytesMut::new();
    b.put_i16(0);
    b.put_i16(transactional_id.len() as i16);
    b.put_slice(transactional_id.as_bytes());
    b.freeze()
}

pub fn encode_value(v: &TxnValue) -> Bytes {
    let mut b = BytesMut::new();
    b.put_i16(0);
    b.put_i64(v.producer_id);
    b.put_i16(v.producer_epoch);
    b.put_i32(v.timeout_ms);
    b.put_i8(v.state as i8);
    b.put_i32(v.partitions.len() as i32);
    for (topic, ps) in &v.partitions {
        b.put_i16(topic.len() as i16);
        b.put_slice(topic.as_bytes());
        b.put_i32(ps.len() as i32);
        for p in ps {
            b.put_i32(*p);
        }
    }
    b.put_i64(v.last_update_ms);
    b.put_i64(v.start_ms);
    b.freeze()
}

struct Reader<'a>(&'a [u8]);

impl Reader<'_> {
    fn take(&mut self, n: usize) -> Option<&[u8]> {
        if self.0.len() < n {
            return None;
        }
        let (a, rest) = self.0.split_at(n);
        self.0 = rest;
        Some(a)
    }
    fn i8(&mut self) -> Option<i8> {
        self.take(1).map(|b| b[0] as i8)
    }
    fn i16(&mut self) -> Option<i16> {
        self.take(2).map(|b| i16::from_be_bytes([b[0], b[1]]))
    }
    fn i32(&mut self) -> Option<i32> {
        self.take(4).map(|b| i32::from_be_bytes(b.try_into().expect("4 bytes")))
    }
    fn i64(&mut self) -> Option<i64> {
        self.take(8).map(|b| i64::from_be_bytes(b.try_into().expect("8 bytes")))
    }
    fn string(&mut self) -> Option<String> {
        let n = self.i16()?;
        if n < 0 {
            return None;
        }
        String::from_utf8(self.take(n as usize)?.to_vec()).ok()
    }
}

pub fn decode_key(buf: &[u8]) -> Option<String> {
    let mut r = Reader(buf);
    if r.i16()? != 0 {
        return None;
    }
    r.string()
}

pub fn decode_value(buf: &[u8]) -> Option<TxnValue> {
    let mut r = Reader(buf);
    if r.i16()? != 0 {
        return None;
    }
    let producer_id = r.i64()?;
    let producer_epoch = r.i16()?;
    let timeout_ms = r.i32()?;
    let state = TxnState::from_code(r.i8()?)?;
    let n = r.i32()?;
    let mut partitions = Vec::new();
    for _ in 0..n.max(0) {
        let topic = r.string()?;
        let count = r.i32()?;
        let ps = (0..count.max(0)).map(|_| r.i32()).collect::<Option<Vec<i32>>>()?;
        partitions.push((topic, ps));
    }
    let last_update_ms = r.i64()?;
    let start_ms = r.i64()?;
    Some(TxnValue { producer_id, producer_epoch, timeout_ms, state, partitions, last_update_ms, start_ms })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn round_trip_and_garbage() {
        let v = TxnValue {
            producer_id: 7,
            producer_epoch: 3,
            timeout_ms: 60_000,
            state: TxnState::Ongoing,
            partitions: vec![("a".into(), vec![0, 2]), ("b".into(), vec![1])],
            last_update_ms: 10,
            start_ms: 5,
        };
        assert_eq!(decode_value(&encode_value(&v)), Some(v));
        assert_eq!(decode_key(&encode_key("tx")), Some("tx".to_string()));
        assert_eq!(decode_value(&[0, 0, 1]), None);
        assert_eq!(decode_key(&[0, 1, 0, 1, b'x']), None);
    }
}
