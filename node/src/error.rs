//! Why a node could not start, or stopped.

use computerd_raft::cluster::ClusterError;

use crate::datadir::DataDirError;

/// Why a node could not start or stopped.
#[derive(Debug, thiserror::Error)]
pub enum NodeError {
    /// A flag has a value that cannot work.
    #[error("{0}")]
    Config(String),
    /// The data directory was refused.
    #[error(transparent)]
    DataDir(#[from] DataDirError),
    /// A listener could not be bound or read.
    #[error("cannot listen on {addr}: {source}")]
    Listen {
        /// The address.
        addr: String,
        /// The error.
        source: std::io::Error,
    },
    /// The replicated store failed.
    #[error("store: {0}")]
    Cluster(#[from] ClusterError),
    /// The data dir belongs to another cluster than the one joined.
    #[error("the data dir belongs to cluster {ours}, but the member at {join} is in cluster {theirs}")]
    OtherCluster {
        /// The cluster in the data dir.
        ours: String,
        /// The cluster of the member.
        theirs: String,
        /// The member asked.
        join: String,
    },
    /// Bootstrapping the organization was refused.
    #[error("bootstrap refused: {0}")]
    Bootstrap(String),
    /// A server task failed.
    #[error("server: {0}")]
    Server(String),
}
