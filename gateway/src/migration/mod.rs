//! A migration's life on this node. [`GatewayCore`] consumes the events and owns every
//! migration's state ([`Shared`]; `ended` remembers which migrations are over); a migration's
//! connections are handled by role: `source` (captured here, carried to the peer gateway) and
//! [`target`] (streams from the peer gateway, judged by `admission`, dialed to the
//! destination).
//!
//! Layering: `core` drives [`crate::capture`] and `source`; `source` and `target` use the
//! shared `state` and [`crate::streams`]; neither the capture nor the streams know this module.

mod admission;
mod core;
mod ended;
mod source;
mod state;
pub(crate) mod target;

pub use self::core::GatewayCore;
pub use admission::Outcome;
pub use state::{DEFAULT_MARK, RdmaState, Settings, Shared};
