//! `meta.properties` in a cluster node's log directory, as Kafka keeps it:
//! the node id the directory belongs to and, once the quorum has one, the
//! cluster id. A directory written for another node id, or holding another
//! cluster's id, is refused, naming both, so one node's data never joins
//! another node or cluster.

use std::io::Write;
use std::path::{Path, PathBuf};

pub const FILE: &str = "meta.properties";

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct MetaProperties {
    pub node_id: i32,
    pub cluster_id: Option<String>,
}

#[derive(Debug, thiserror::Error)]
pub enum MetaPropertiesError {
    #[error("{path}: {source}")]
    Io { path: PathBuf, source: std::io::Error },
    #[error("{path}: {reason}")]
    Invalid { path: PathBuf, reason: String },
    #[error("{path} belongs to node.id={stored}, but this node is node.id={configured}")]
    OtherNode { path: PathBuf, stored: i32, configured: i32 },
    #[error("{path} belongs to cluster {stored}, but the metadata quorum is cluster {quorum}")]
    OtherCluster { path: PathBuf, stored: String, quorum: String },
}

impl MetaProperties {
    /// Reads `dir/meta.properties`; `None` when the file does not exist.
    pub fn read(dir: &Path) -> Result<Option<MetaProperties>, MetaPropertiesError> {
        let path = dir.join(FILE);
        let text = match std::fs::read_to_string(&path) {
            Ok(t) => t,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(None),
            Err(source) => return Err(MetaPropertiesError::Io { path, source }),
        };
        let mut node_id = None;
        let mut cluster_id = None;
        for line in text.lines().map(str::trim).filter(|l| !l.is_empty() && !l.starts_with('#')) {
            let Some((key, value)) = line.split_once('=') else {
                return Err(MetaPropertiesError::Invalid { path, reason: format!("line {line:?} is not key=value") });
            };
            match key.trim() {
                "node.id" => {
                    node_id = Some(value.trim().parse::<i32>().map_err(|e| MetaPropertiesError::Invalid {
                        path: path.clone(),
                        reason: format!("node.id {value:?}: {e}"),
                    })?)
                }
                "cluster.id" => cluster_id = Some(value.trim().to_string()),
                // version, directory.id and others: not ours to check.
                _ => {}
            }
        }
        let node_id =
            node_id.ok_or_else(|| MetaPropertiesError::Invalid { path: path.clone(), reason: "no node.id".into() })?;
        Ok(Some(MetaProperties { node_id, cluster_id }))
    }

    /// Writes `dir/meta.properties` atomically (a temporary file, fsync,
    /// rename, fsync of the directory).
    pub fn write(&self, dir: &Path) -> Result<(), MetaPropertiesError> {
        let path = dir.join(FILE);
        let tmp = dir.join(format!("{FILE}.tmp"));
        let io = |source| MetaPropertiesError::Io { path: path.clone(), source };
        let mut text = String::from("#\n# Written by Strand; do not edit.\nversion=1\n");
        text.push_str(&format!("node.id={}\n", self.node_id));
        if let Some(c) = &self.cluster_id {
            text.push_str(&format!("cluster.id={c}\n"));
        }
        std::fs::create_dir_all(dir).map_err(io)?;
        let mut f = std::fs::File::create(&tmp).map_err(io)?;
        f.write_all(text.as_bytes()).map_err(io)?;
        f.sync_all().map_err(io)?;
        std::fs::rename(&tmp, &path).map_err(io)?;
        std::fs::File::open(dir).and_then(|d| d.sync_all()).map_err(io)
    }

    /// At start-up: the directory's properties, checked against `node_id`
    /// (written, without a cluster id yet, when the directory is new).
    pub fn open(dir: &Path, node_id: i32) -> Result<MetaProperties, MetaPropertiesError> {
        match MetaProperties::read(dir)? {
            Some(m) if m.node_id != node_id => {
                Err(MetaPropertiesError::OtherNode { path: dir.join(FILE), stored: m.node_id, configured: node_id })
            }
            Some(m) => Ok(m),
            None => {
                let m = MetaProperties { node_id, cluster_id: None };
                m.write(dir)?;
                Ok(m)
            }
        }
    }

    /// The quorum's cluster id is known: record it, or refuse a different one.
    pub fn adopt_cluster_id(&mut self, dir: &Path, quorum: &str) -> Result<(), MetaPropertiesError> {
        match &self.cluster_id {
            Some(stored) if stored == quorum => Ok(()),
            Some(stored) => Err(MetaPropertiesError::OtherCluster {
                path: dir.join(FILE),
                stored: stored.clone(),
                quorum: quorum.to_string(),
            }),
            None => {
                self.cluster_id = Some(quorum.to_string());
                self.write(dir)
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_new_directory_is_claimed_and_other_nodes_and_clusters_are_refused() {
        let dir = tempfile::tempdir().unwrap();
        let mut m = MetaProperties::open(dir.path(), 1).unwrap();
        assert_eq!(m, MetaProperties { node_id: 1, cluster_id: None });
        m.adopt_cluster_id(dir.path(), "abc").unwrap();
        assert_eq!(MetaProperties::read(dir.path()).unwrap(), Some(m.clone()));
        let err = MetaProperties::open(dir.path(), 2).unwrap_err().to_string();
        assert!(err.contains("node.id=1") && err.contains("node.id=2"), "{err}");
        let mut again = MetaProperties::open(dir.path(), 1).unwrap();
        again.adopt_cluster_id(dir.path(), "abc").unwrap();
        let err = again.adopt_cluster_id(dir.path(), "xyz").unwrap_err().to_string();
        assert!(err.contains("abc") && err.contains("xyz"), "{err}");
    }

    #[test]
    fn garbage_is_named() {
        let dir = tempfile::tempdir().unwrap();
        std::fs::write(dir.path().join(FILE), "node.id=x\n").unwrap();
        let err = MetaProperties::read(dir.path()).unwrap_err().to_string();
        assert!(err.contains("meta.properties") && err.contains("node.id"), "{err}");
    }
}
