//! The names scripts, the chart and users depend on, written once (the names table of the
//! design). Tests that check the contract from outside keep their own literals on purpose.

// === Labels and annotations ===

/// The domain of every label and annotation of the project (also the CDI vendor of a resource
/// name given without a domain).
pub const DOMAIN: &str = "rdma-streams.io";
/// Pod label (objectSelector) or annotation (matchConditions) that opts a pod in
/// ([`INJECT_TRUE`]) or out ([`INJECT_FALSE`]); namespace label that opts every pod in
/// ([`NAMESPACE_ENABLED`]).
pub const INJECT: &str = "rdma-streams.io/inject";
/// Pod opt-in value of [`INJECT`].
pub const INJECT_TRUE: &str = "true";
/// Pod opt-out value of [`INJECT`] (wins over a namespace opt-in).
pub const INJECT_FALSE: &str = "false";
/// Namespace opt-in value of [`INJECT`].
pub const NAMESPACE_ENABLED: &str = "enabled";
/// Pod annotation naming the injection profile.
pub const PROFILE_ANNOTATION: &str = "rdma-streams.io/profile";
/// Pod annotation listing the target containers (comma list).
pub const CONTAINERS_ANNOTATION: &str = "rdma-streams.io/containers";
/// Pod annotation the injector writes: JSON `{version, profile, containers, hash}`.
pub const STATUS_ANNOTATION: &str = "rdma-streams.io/status";
/// VM template label (propagated to its VMIs and virt-launcher pods) that opts a VM in to RDMA
/// migration, and the annotation the injector writes on the launcher pod for the gateway.
pub const MIGRATION: &str = "rdma-streams.io/migration";
/// The value of [`MIGRATION`] that opts in; the only migration transport so far.
pub const MIGRATION_RDMA: &str = "rdma";

// === Resources ===

/// The extended resource the device plugin advertises without a config file, and the one an
/// injection profile requests when it names none.
pub const DEFAULT_RESOURCE: &str = "rdma-streams.io/hca";

// === The shim's environment ===

/// Where the shim loads the RDMA libraries from (librdmacm; libibverbs beside it).
pub const SHIM_PROVIDER_ENV: &str = "STREAMSHIM_PROVIDER";
/// The shim's policy file.
pub const SHIM_POLICY_ENV: &str = "STREAMSHIM_POLICY";
/// The shim's data mode ([`SHIM_MODE_PROXY`]).
pub const SHIM_MODE_ENV: &str = "STREAMSHIM_MODE";
/// The proxy data mode, the default.
pub const SHIM_MODE_PROXY: &str = "proxy";
/// Where the shim writes per-process stats.
pub const SHIM_STATS_ENV: &str = "STREAMSHIM_STATS";
/// The shim's stderr log level.
pub const SHIM_LOG_ENV: &str = "STREAMSHIM_LOG";
/// The shim's kill switch (`1` turns it off).
pub const SHIM_DISABLE_ENV: &str = "STREAMSHIM_DISABLE";
/// The shim's negotiation bound, in milliseconds.
pub const SHIM_NEGOTIATE_ENV: &str = "STREAMSHIM_NEGOTIATE_MS";
/// The shim's ring per direction and connection, in KiB.
pub const SHIM_RING_ENV: &str = "STREAMSHIM_RING_KIB";
/// The shim's switch of direct reads from the receive ring (`0` turns them off).
pub const SHIM_DIRECT_READ_ENV: &str = "STREAMSHIM_DIRECT_READ";
/// The shim's switch of direct writes into the send ring (`0` turns them off).
pub const SHIM_DIRECT_WRITE_ENV: &str = "STREAMSHIM_DIRECT_WRITE";
/// The shim's switch of spare connections (`0` turns them off).
pub const SHIM_SPARE_ENV: &str = "STREAMSHIM_SPARE";
/// The shim's switch of reused connections (`0` turns them off).
pub const SHIM_REUSE_ENV: &str = "STREAMSHIM_REUSE";
/// The cluster's Service CIDRs, to which the shim's clients never negotiate.
pub const SHIM_SERVICE_CIDRS_ENV: &str = "STREAMSHIM_SERVICE_CIDRS";

/// The shim's environment variables, for checks that a name is one of them: every variable
/// the shim reads (its settings type, `shim/core/src/settings.rs`, checks this list).
pub const SHIM_ENV: &[&str] = &[
    SHIM_PROVIDER_ENV,
    SHIM_POLICY_ENV,
    SHIM_MODE_ENV,
    SHIM_STATS_ENV,
    SHIM_LOG_ENV,
    SHIM_DISABLE_ENV,
    SHIM_NEGOTIATE_ENV,
    SHIM_RING_ENV,
    SHIM_DIRECT_READ_ENV,
    SHIM_DIRECT_WRITE_ENV,
    SHIM_SPARE_ENV,
    SHIM_REUSE_ENV,
    SHIM_SERVICE_CIDRS_ENV,
];
