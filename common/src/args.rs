//! The flags every long-running binary shares, as clap argument groups each binary flattens
//! into its own command line (`#[command(flatten)]`): [`LogArgs`] (`--log-level`,
//! `--log-format`) and [`AdminArgs`] (`--admin-listen`).
//!
//! Each binary keeps its own environment variables (`RDMA_DP_LOG_LEVEL`,
//! `RDMA_INJECTOR_LOG_LEVEL`, `RDMA_GW_LOG_LEVEL`, ...): the groups are generic over a
//! [`FlagEnv`] that names them, declared with [`flag_env!`](crate::flag_env) from the
//! binary's prefix.
//!
//! ```
//! use clap::Parser;
//! use rdma_streams_common::args::{AdminArgs, FlagEnv, LogArgs};
//!
//! rdma_streams_common::flag_env! {
//!     /// `EXAMPLE_<FLAG>`.
//!     enum Env = "EXAMPLE";
//! }
//! assert_eq!(<Env as FlagEnv>::LOG_LEVEL, "EXAMPLE_LOG_LEVEL");
//!
//! #[derive(Debug, Parser)]
//! struct Args {
//!     #[command(flatten)]
//!     log: LogArgs<Env>,
//!     #[command(flatten)]
//!     admin: AdminArgs<Env>,
//! }
//!
//! let args = Args::parse_from(["example", "--log-level", "debug", "--admin-listen", "127.0.0.1:9101"]);
//! assert_eq!(args.log.level, "debug");
//! assert_eq!(args.admin.listen, Some(([127, 0, 0, 1], 9101).into()));
//! ```

use std::{fmt, marker::PhantomData, net::SocketAddr};

use crate::telemetry::{self, LogFormat};

/// Declares an uninhabited type that implements [`FlagEnv`](crate::args::FlagEnv) with the
/// variables `<PREFIX>_LOG_LEVEL`, `<PREFIX>_LOG_FORMAT` and `<PREFIX>_ADMIN_LISTEN`, the
/// binary's own prefix as for every other flag; the trait's defaulted constants may follow.
///
/// ```
/// use rdma_streams_common::args::FlagEnv;
///
/// rdma_streams_common::flag_env! {
///     pub enum GwEnv = "RDMA_GW";
///     const ADMIN_LISTEN_DEFAULT: Option<&'static str> = Some("0.0.0.0:9103");
///     const GLOBAL: bool = false;
/// }
/// assert_eq!(GwEnv::ADMIN_LISTEN, "RDMA_GW_ADMIN_LISTEN");
/// assert_eq!(GwEnv::ADMIN_LISTEN_DEFAULT, Some("0.0.0.0:9103"));
/// assert!(!GwEnv::GLOBAL);
/// ```
#[macro_export]
macro_rules! flag_env {
    (
        $(#[$meta:meta])*
        $vis:vis enum $name:ident = $prefix:literal;
        $(const $item:ident: $ty:ty = $value:expr;)*
    ) => {
        $(#[$meta])*
        #[derive(Clone, Debug)]
        $vis enum $name {}

        impl $crate::args::FlagEnv for $name {
            const LOG_LEVEL: &'static str = concat!($prefix, "_LOG_LEVEL");
            const LOG_FORMAT: &'static str = concat!($prefix, "_LOG_FORMAT");
            const ADMIN_LISTEN: &'static str = concat!($prefix, "_ADMIN_LISTEN");
            $(const $item: $ty = $value;)*
        }
    };
}

/// The environment variables of one binary's shared flags.
pub trait FlagEnv: Clone + fmt::Debug + Send + Sync + 'static {
    /// `--log-level`.
    const LOG_LEVEL: &'static str;
    /// `--log-format`.
    const LOG_FORMAT: &'static str;
    /// `--admin-listen`.
    const ADMIN_LISTEN: &'static str;
    /// `--admin-listen` when neither the flag nor its variable is given; `None`: no admin
    /// endpoint.
    const ADMIN_LISTEN_DEFAULT: Option<&'static str> = None;
    /// Whether the flags are accepted after a subcommand too (`clap`'s `global`).
    const GLOBAL: bool = true;
}

/// `--log-level` and `--log-format`.
#[derive(Clone, Debug, clap::Args)]
pub struct LogArgs<E: FlagEnv> {
    /// Log format.
    #[arg(
        id = "log_format",
        long = "log-format",
        value_name = "LOG_FORMAT",
        env = E::LOG_FORMAT,
        value_enum,
        default_value = "text",
        global = E::GLOBAL
    )]
    pub format: LogFormat,

    /// Log filter (`info`, `debug`, `<crate>=debug,info`, ...; an invalid one means `info`).
    #[arg(
        id = "log_level",
        long = "log-level",
        value_name = "LOG_LEVEL",
        env = E::LOG_LEVEL,
        default_value = "info",
        global = E::GLOBAL
    )]
    pub level: String,

    #[arg(skip)]
    _env: PhantomData<E>,
}

/// `--admin-listen`: where the admin endpoint (`/live`, `/ready`, `/metrics`,
/// [`crate::admin`]) listens.
#[derive(Clone, Debug, clap::Args)]
pub struct AdminArgs<E: FlagEnv> {
    /// Admin endpoint (`/live`, `/ready`, `/metrics`): an IP and port, e.g. `0.0.0.0:9101`.
    #[arg(
        id = "admin_listen",
        long = "admin-listen",
        value_name = "ADMIN_LISTEN",
        env = E::ADMIN_LISTEN,
        default_value = E::ADMIN_LISTEN_DEFAULT,
        global = E::GLOBAL
    )]
    pub listen: Option<SocketAddr>,

    #[arg(skip)]
    _env: PhantomData<E>,
}

// === impl LogArgs ===

impl<E: FlagEnv> LogArgs<E> {
    /// These settings, without the command line (tests, embedders).
    pub fn new(format: LogFormat, level: impl Into<String>) -> Self {
        Self {
            format,
            level: level.into(),
            _env: PhantomData,
        }
    }

    /// Installs the process's log subscriber ([`telemetry::init`]).
    pub fn init(&self) {
        telemetry::init(self.format, &self.level);
    }
}

// === impl AdminArgs ===

impl<E: FlagEnv> AdminArgs<E> {
    /// This address, without the command line (tests, embedders).
    pub fn new(listen: Option<SocketAddr>) -> Self {
        Self {
            listen,
            _env: PhantomData,
        }
    }
}

#[cfg(test)]
mod tests {
    use clap::{CommandFactory, Parser};

    use super::*;

    #[derive(Clone, Debug)]
    enum Plain {}
    impl FlagEnv for Plain {
        const LOG_LEVEL: &'static str = "T_LOG_LEVEL";
        const LOG_FORMAT: &'static str = "T_LOG_FORMAT";
        const ADMIN_LISTEN: &'static str = "T_ADMIN_LISTEN";
    }

    #[derive(Clone, Debug)]
    enum Defaulted {}
    impl FlagEnv for Defaulted {
        const LOG_LEVEL: &'static str = "D_LOG_LEVEL";
        const LOG_FORMAT: &'static str = "D_LOG_FORMAT";
        const ADMIN_LISTEN: &'static str = "D_ADMIN_LISTEN";
        const ADMIN_LISTEN_DEFAULT: Option<&'static str> = Some("0.0.0.0:9103");
        const GLOBAL: bool = false;
    }

    #[derive(Debug, Parser)]
    struct Cli<E: FlagEnv> {
        #[command(flatten)]
        log: LogArgs<E>,
        #[command(flatten)]
        admin: AdminArgs<E>,
        #[command(subcommand)]
        command: Option<Sub>,
    }

    #[derive(Debug, clap::Subcommand)]
    enum Sub {
        Serve,
    }

    fn env_of(cmd: &clap::Command, long: &str) -> Option<String> {
        cmd.get_arguments()
            .find(|a| a.get_long() == Some(long))
            .and_then(|a| a.get_env())
            .map(|e| e.to_string_lossy().into_owned())
    }

    #[test]
    fn each_binary_names_its_own_variables() {
        let cmd = Cli::<Plain>::command();
        cmd.clone().debug_assert();
        assert_eq!(env_of(&cmd, "log-level").as_deref(), Some("T_LOG_LEVEL"));
        assert_eq!(env_of(&cmd, "log-format").as_deref(), Some("T_LOG_FORMAT"));
        assert_eq!(
            env_of(&cmd, "admin-listen").as_deref(),
            Some("T_ADMIN_LISTEN")
        );
        let cmd = Cli::<Defaulted>::command();
        cmd.clone().debug_assert();
        assert_eq!(
            env_of(&cmd, "admin-listen").as_deref(),
            Some("D_ADMIN_LISTEN")
        );
    }

    #[test]
    fn defaults_and_values() {
        let cli = Cli::<Plain>::try_parse_from(["x"]).unwrap();
        assert_eq!(cli.log.format, LogFormat::Text);
        assert_eq!(cli.log.level, "info");
        assert_eq!(cli.admin.listen, None);

        let cli = Cli::<Defaulted>::try_parse_from(["x"]).unwrap();
        assert_eq!(cli.admin.listen, Some(([0, 0, 0, 0], 9103).into()));

        let cli = Cli::<Plain>::try_parse_from([
            "x",
            "--log-format",
            "json",
            "--log-level",
            "rdma=debug,info",
            "--admin-listen",
            "[::1]:9101",
        ])
        .unwrap();
        assert_eq!(cli.log.format, LogFormat::Json);
        assert_eq!(cli.log.level, "rdma=debug,info");
        assert_eq!(cli.admin.listen, Some("[::1]:9101".parse().unwrap()));
        assert!(Cli::<Plain>::try_parse_from(["x", "--admin-listen", "localhost:1"]).is_err());
    }

    #[test]
    fn global_flags_are_accepted_after_the_subcommand() {
        let cli = Cli::<Plain>::try_parse_from(["x", "serve", "--log-level", "debug"]).unwrap();
        assert_eq!(cli.log.level, "debug");
        assert!(matches!(cli.command, Some(Sub::Serve)));
        assert!(Cli::<Defaulted>::try_parse_from(["x", "serve", "--log-level", "debug"]).is_err());
    }
}
