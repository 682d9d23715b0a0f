//! The broker's persisted metadata: cluster id, node id, topics (name, id,
//! partition count, config overrides) and dynamic broker configs.
//!
//! One JSON file in the log directory, replaced atomically on every change
//! (write a temporary file, fsync, rename, fsync the directory). In a cluster
//! this becomes the image of the Raft metadata log; the single node keeps the
//! same information in a file.

use std::collections::BTreeMap;
use std::fs;
use std::io::Write;
use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};
use uuid::Uuid;

pub const METADATA_FILE: &str = "strand-metadata.json";
const FORMAT_VERSION: u32 = 1;

#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, Eq)]
pub struct TopicRecord {
    pub id: Uuid,
    pub partitions: i32,
    #[serde(default)]
    pub configs: BTreeMap<String, String>,
    #[serde(default)]
    pub internal: bool,
    /// In a cluster, the partitions this broker hosts (the controller placed
    /// the others elsewhere); `None` on a single node: all of them.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub hosted: Option<Vec<i32>>,
}

#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct MetadataImage {
    pub version: u32,
    pub cluster_id: String,
    pub node_id: i32,
    #[serde(default)]
    pub topics: BTreeMap<String, TopicRecord>,
    #[serde(default)]
    pub broker_configs_cluster_default: BTreeMap<String, String>,
    #[serde(default)]
    pub broker_configs_this_broker: BTreeMap<String, String>,
    /// Producer ids below this may have been handed out: a restart continues from here.
    #[serde(default)]
    pub producer_id_block_end: i64,
}

#[derive(Debug, thiserror::Error)]
pub enum MetadataError {
    #[error("I/O error on {path}: {source}")]
    Io { path: PathBuf, source: std::io::Error },
    #[error("{path} is not valid metadata: {reason}")]
    Corrupt { path: PathBuf, reason: String },
    #[error("{path} belongs to node {found}, but this broker is node.id={configured}")]
    NodeIdMismatch { path: PathBuf, found: i32, configured: i32 },
}

/// Kafka cluster ids are 16 random bytes in URL-safe base64 without padding.
pub fn new_cluster_id() -> String {
    use base64::Engine;
    base64::engine::general_purpose::URL_SAFE_NO_PAD.encode(Uuid::new_v4().as_bytes())
}

/// The metadata file and its in-memory image.
#[derive(Debug)]
pub struct MetadataStore {
    path: PathBuf,
    pub image: MetadataImage,
}

impl MetadataStore {
    /// Loads the metadata in `log_dir`, creating a fresh image (new cluster id) if none exists.
    pub fn open(log_dir: &Path, node_id: i32) -> Result<MetadataStore, MetadataError> {
        let path = log_dir.join(METADATA_FILE);
        let io = |source| MetadataError::Io { path: path.clone(), source };
        fs::create_dir_all(log_dir).map_err(io)?;
        match fs::read(&path) {
            Ok(bytes) => {
                let image: MetadataImage = serde_json::from_slice(&bytes)
                    .map_err(|e| MetadataError::Corrupt { path: path.clone(), reason: e.to_string() })?;
                if image.version != FORMAT_VERSION {
                    return Err(MetadataError::Corrupt {
                        path,
                        reason: format!("format version {} is not {FORMAT_VERSION}", image.version),
                    });
                }
                if image.node_id != node_id {
                    return Err(MetadataError::NodeIdMismatch { path, found: image.node_id, configured: node_id });
                }
                Ok(MetadataStore { path, image })
            }
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
                let store = MetadataStore {
                    path,
                    image: MetadataImage {
                        version: FORMAT_VERSION,
                        cluster_id: new_cluster_id(),
                        node_id,
                        topics: BTreeMap::new(),
                        broker_configs_cluster_default: BTreeMap::new(),
                        broker_configs_this_broker: BTreeMap::new(),
                        producer_id_block_end: 0,
                    },
                };
                store.save()?;
                Ok(store)
            }
            Err(e) => Err(io(e)),
        }
    }

    /// Writes the image durably and atomically.
    pub fn save(&self) -> Result<(), MetadataError> {
        let io = |source| MetadataError::Io { path: self.path.clone(), source };
        let tmp = self.path.with_extension("json.tmp");
        let bytes = serde_json::to_vec_pretty(&self.image).expect("metadata serialises");
        let mut f = fs::File::create(&tmp).map_err(io)?;
        f.write_all(&bytes).map_err(io)?;
        f.sync_all().map_err(io)?;
        fs::rename(&tmp, &self.path).map_err(io)?;
        if let Some(dir) = self.path.parent() {
            fs::File::open(dir).and_then(|d| d.sync_all()).map_err(io)?;
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn image_survives_reopen_and_node_id_is_checked() {
        let dir = tempfile::tempdir().unwrap();
        let mut s = MetadataStore::open(dir.path(), 1).unwrap();
        let id = s.image.cluster_id.clone();
        assert_eq!(id.len(), 22);
        s.image.topics.insert(
            "t".into(),
            TopicRecord { id: Uuid::new_v4(), partitions: 3, configs: BTreeMap::new(), internal: false, hosted: None },
        );
        s.save().unwrap();
        let again = MetadataStore::open(dir.path(), 1).unwrap();
        assert_eq!(again.image.cluster_id, id);
        assert_eq!(again.image.topics["t"].partitions, 3);
        assert!(matches!(MetadataStore::open(dir.path(), 2), Err(MetadataError::NodeIdMismatch { .. })));
    }

    #[test]
    fn garbage_file_is_refused_by_name() {
        let dir = tempfile::tempdir().unwrap();
        fs::write(dir.path().join(METADATA_FILE), b"{not json").unwrap();
        let err = MetadataStore::open(dir.path(), 1).unwrap_err().to_string();
        assert!(err.contains(METADATA_FILE), "{err}");
    }
}
