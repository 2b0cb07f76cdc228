//! What a pool hands out: its slots over the inventory, and the Allocate answers.
//!
//! - `pool`: the config of a pool applied to the inventory ([`pool::PoolSnapshot`]), the
//!   slots advertised to kubelet;
//! - `allocate`: the char devices, env and mounts of the HCAs behind requested IDs;
//! - `preferred`: GetPreferredAllocation, packing onto one HCA and one NUMA node;
//! - `cdi`: the CDI spec file per pool, the other way to hand devices over.
//!
//! Pure over the inventory and config; the kubelet side serves it.

pub(crate) mod allocate;
pub(crate) mod cdi;
pub(crate) mod pool;
pub(crate) mod preferred;
