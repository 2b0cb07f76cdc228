//! The Soft-RoCE scenarios beyond the smoke tests, one module per area.

pub mod attacks;
pub mod conformance;
pub mod cpython;
pub mod gateway;
pub mod shim_apps;
pub mod shim_faults;
pub mod shim_handed;
pub mod shim_load;
pub mod shim_memory;
pub mod shim_nginx;
pub mod shim_spare;
pub mod shim_wire;
pub mod support;
