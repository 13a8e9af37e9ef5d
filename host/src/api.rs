//! All a front-end may use of the server, in one place: the [`Server`] and the types of its
//! answers and errors. `protocol/` imports nothing else of the host but the limits and the
//! telemetry settings (`scripts/import-graph.py` checks it), so a new front-end (a streaming one,
//! an OpenAI-compatible one) lands on this boundary, not on the internals behind it.

pub use crate::backend::wasm::{FunctionBody, InvokeError};
pub use crate::functions::FunctionUpload;
pub use crate::metrics::{StatsSnapshot, Tally};
pub use crate::repository::{ControlError, IndexRow, LoadOutcome, ModelState};
pub use crate::server::{Deployed, FunctionError, LoadRequest, Server, VersionStatistics};
pub use crate::shm::{
    OPERATOR_ONLY as SHARED_MEMORY_OPERATOR_ONLY, RegionStatus, SharedMemory, ShmError,
    requested_outputs, write_outputs,
};
pub use crate::tenants::{AuthError, Principal, TenantError};
