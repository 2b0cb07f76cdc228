//! Loading librdmacm and libibverbs at run time, and the table of the C functions we call.
//!
//! Nothing links rdma-core: `libstreamshim.so` keeps `NEEDED` to libc and libgcc_s only, so an
//! image without rdma-core still starts. The libraries are opened with
//! `dlopen(RTLD_NOW | RTLD_LOCAL)` once per process and never closed (their state lives as long
//! as the ids, queue pairs and memory registrations made with them). Types and the inline verbs
//! (`ibv_post_send`, `ibv_poll_cq`, ... which call through the device's ops table) come from
//! `rdma-sys`; only the exported functions are bound here, by name.

use std::ffi::{CStr, CString, c_void};
use std::fmt;

use libc::{c_char, c_int, c_uint, size_t, sockaddr};
use rdma_sys::{
    ibv_comp_channel, ibv_context, ibv_cq, ibv_fork_status, ibv_mr, ibv_pd, ibv_qp_init_attr,
    rdma_cm_event, rdma_cm_event_type, rdma_cm_id, rdma_conn_param, rdma_event_channel,
    rdma_port_space,
};

/// The system's librdmacm, for callers not told another one (which library to load is the
/// caller's setting, never read here); libibverbs is the one librdmacm loads.
pub const DEFAULT_PROVIDER: &str = "librdmacm.so.1";
/// The libibverbs soname.
pub const VERBS_SONAME: &str = "libibverbs.so.1";

/// Why the RDMA libraries could not be loaded.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum LoadError {
    /// The name contains a NUL byte.
    #[error("RDMA library name {name:?} contains a NUL byte")]
    InvalidName {
        /// The name as given.
        name: String,
    },
    /// `dlopen` failed.
    #[error("cannot load {name:?}: {reason}")]
    Open {
        /// The name or path.
        name: String,
        /// `dlerror()`'s message.
        reason: String,
    },
    /// A required function is missing.
    #[error("{name:?} has no `{symbol}` function")]
    MissingSymbol {
        /// The library.
        name: String,
        /// The first missing symbol.
        symbol: &'static str,
    },
}

type CreateEventChannel = unsafe extern "C" fn() -> *mut rdma_event_channel;
type DestroyEventChannel = unsafe extern "C" fn(*mut rdma_event_channel);
type CreateId = unsafe extern "C" fn(
    *mut rdma_event_channel,
    *mut *mut rdma_cm_id,
    *mut c_void,
    rdma_port_space::Type,
) -> c_int;
type IdFn = unsafe extern "C" fn(*mut rdma_cm_id) -> c_int;
type BindAddr = unsafe extern "C" fn(*mut rdma_cm_id, *mut sockaddr) -> c_int;
type ResolveAddr =
    unsafe extern "C" fn(*mut rdma_cm_id, *mut sockaddr, *mut sockaddr, c_int) -> c_int;
type IdIntFn = unsafe extern "C" fn(*mut rdma_cm_id, c_int) -> c_int;
type CreateQp = unsafe extern "C" fn(*mut rdma_cm_id, *mut ibv_pd, *mut ibv_qp_init_attr) -> c_int;
type DestroyQp = unsafe extern "C" fn(*mut rdma_cm_id);
type ConnParamFn = unsafe extern "C" fn(*mut rdma_cm_id, *mut rdma_conn_param) -> c_int;
type Reject = unsafe extern "C" fn(*mut rdma_cm_id, *const c_void, u8) -> c_int;
type GetCmEvent = unsafe extern "C" fn(*mut rdma_event_channel, *mut *mut rdma_cm_event) -> c_int;
type AckCmEvent = unsafe extern "C" fn(*mut rdma_cm_event) -> c_int;
type SetOption = unsafe extern "C" fn(*mut rdma_cm_id, c_int, c_int, *mut c_void, size_t) -> c_int;
type EventStr = unsafe extern "C" fn(rdma_cm_event_type::Type) -> *const c_char;
type GetDevices = unsafe extern "C" fn(*mut c_int) -> *mut *mut ibv_context;
type FreeDevices = unsafe extern "C" fn(*mut *mut ibv_context);

type AllocPd = unsafe extern "C" fn(*mut ibv_context) -> *mut ibv_pd;
type DeallocPd = unsafe extern "C" fn(*mut ibv_pd) -> c_int;
type RegMr = unsafe extern "C" fn(*mut ibv_pd, *mut c_void, size_t, c_int) -> *mut ibv_mr;
type DeregMr = unsafe extern "C" fn(*mut ibv_mr) -> c_int;
type CreateCompChannel = unsafe extern "C" fn(*mut ibv_context) -> *mut ibv_comp_channel;
type DestroyCompChannel = unsafe extern "C" fn(*mut ibv_comp_channel) -> c_int;
type CreateCq = unsafe extern "C" fn(
    *mut ibv_context,
    c_int,
    *mut c_void,
    *mut ibv_comp_channel,
    c_int,
) -> *mut ibv_cq;
type DestroyCq = unsafe extern "C" fn(*mut ibv_cq) -> c_int;
type GetCqEvent =
    unsafe extern "C" fn(*mut ibv_comp_channel, *mut *mut ibv_cq, *mut *mut c_void) -> c_int;
type AckCqEvents = unsafe extern "C" fn(*mut ibv_cq, c_uint);
type ForkInit = unsafe extern "C" fn() -> c_int;
type IsForkInitialized = unsafe extern "C" fn() -> ibv_fork_status;

/// The bound functions. `pub(crate)`: only the wrappers in this module tree call them.
pub(crate) struct Fns {
    pub(crate) create_event_channel: CreateEventChannel,
    pub(crate) destroy_event_channel: DestroyEventChannel,
    pub(crate) create_id: CreateId,
    pub(crate) destroy_id: IdFn,
    pub(crate) bind_addr: BindAddr,
    pub(crate) resolve_addr: ResolveAddr,
    pub(crate) resolve_route: IdIntFn,
    pub(crate) listen: IdIntFn,
    pub(crate) create_qp: CreateQp,
    pub(crate) destroy_qp: DestroyQp,
    pub(crate) connect: ConnParamFn,
    pub(crate) accept: ConnParamFn,
    pub(crate) reject: Reject,
    pub(crate) disconnect: IdFn,
    pub(crate) get_cm_event: GetCmEvent,
    pub(crate) ack_cm_event: AckCmEvent,
    pub(crate) set_option: SetOption,
    pub(crate) event_str: EventStr,
    pub(crate) get_devices: GetDevices,
    pub(crate) free_devices: FreeDevices,
    pub(crate) alloc_pd: AllocPd,
    pub(crate) dealloc_pd: DeallocPd,
    pub(crate) reg_mr: RegMr,
    pub(crate) dereg_mr: DeregMr,
    pub(crate) create_comp_channel: CreateCompChannel,
    pub(crate) destroy_comp_channel: DestroyCompChannel,
    pub(crate) create_cq: CreateCq,
    pub(crate) destroy_cq: DestroyCq,
    pub(crate) get_cq_event: GetCqEvent,
    pub(crate) ack_cq_events: AckCqEvents,
    pub(crate) fork_init: ForkInit,
    /// rdma-core v35 and later.
    pub(crate) is_fork_initialized: Option<IsForkInitialized>,
}

/// librdmacm and libibverbs, loaded once per process (see the module docs).
pub struct Lib {
    name: String,
    pub(crate) fns: Fns,
}

impl fmt::Debug for Lib {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Lib").field("name", &self.name).finish()
    }
}

/// The latest `dlerror()` message.
fn dl_error() -> String {
    // SAFETY: dlerror returns null or a NUL-terminated string owned by libdl (thread-local in
    // glibc), valid until the next dl* call on this thread; it is copied out at once.
    let msg = unsafe { libc::dlerror() };
    if msg.is_null() {
        return String::from("unknown dlopen error");
    }
    // SAFETY: non-null and NUL-terminated (see above).
    unsafe { CStr::from_ptr(msg) }
        .to_string_lossy()
        .into_owned()
}

fn open(name: &str, flags: c_int) -> Result<*mut c_void, LoadError> {
    let c_name = CString::new(name).map_err(|_| LoadError::InvalidName {
        name: name.to_owned(),
    })?;
    // SAFETY: `c_name` is NUL-terminated. Loading runs the library's constructors, which is
    // what loading it means; RTLD_LOCAL keeps its symbols out of the global scope.
    let handle = unsafe { libc::dlopen(c_name.as_ptr(), flags) };
    if handle.is_null() {
        return Err(LoadError::Open {
            name: name.to_owned(),
            reason: dl_error(),
        });
    }
    Ok(handle)
}

fn symbol(handle: *mut c_void, name: &CStr) -> Option<*mut c_void> {
    // SAFETY: `handle` is a live dlopen handle (never closed) and `name` is NUL-terminated.
    let address = unsafe { libc::dlsym(handle, name.as_ptr()) };
    (!address.is_null()).then_some(address)
}

/// Binds the required function `$name` of `$handle` as the function pointer type `$ty`.
macro_rules! bind {
    ($handle:expr, $lib:expr, $name:literal as $ty:ty) => {{
        let address = symbol($handle, $name).ok_or_else(|| LoadError::MissingSymbol {
            name: $lib.to_owned(),
            symbol: $name.to_str().unwrap_or("?"),
        })?;
        // SAFETY: the symbol is rdma-core's exported function of this name, whose C prototype
        // (rdma_cma.h, verbs.h) is what `$ty` spells out; function and data pointers have the
        // same size and representation on the supported (Linux) targets.
        unsafe { std::mem::transmute::<*mut c_void, $ty>(address) }
    }};
}

/// An optional function, bound when present.
macro_rules! bind_optional {
    ($handle:expr, $name:literal as $ty:ty) => {{
        symbol($handle, $name).map(|address| {
            // SAFETY: as in `bind!`.
            unsafe { std::mem::transmute::<*mut c_void, $ty>(address) }
        })
    }};
}

/// Where libibverbs is: the copy librdmacm already loaded (matched by soname), else a
/// `libibverbs.so.1` beside a librdmacm given as a path, else the system's.
fn open_verbs(rdmacm: &str) -> Result<(*mut c_void, String), LoadError> {
    if let Ok(h) = open(
        VERBS_SONAME,
        libc::RTLD_NOW | libc::RTLD_LOCAL | libc::RTLD_NOLOAD,
    ) {
        return Ok((h, VERBS_SONAME.to_owned()));
    }
    if let Some(dir) = std::path::Path::new(rdmacm).parent()
        && !dir.as_os_str().is_empty()
    {
        let beside = dir.join(VERBS_SONAME);
        if beside.is_file() {
            let name = beside.to_string_lossy().into_owned();
            return open(&name, libc::RTLD_NOW | libc::RTLD_LOCAL).map(|h| (h, name));
        }
    }
    open(VERBS_SONAME, libc::RTLD_NOW | libc::RTLD_LOCAL).map(|h| (h, VERBS_SONAME.to_owned()))
}

fn bind_all(cm: *mut c_void, cm_name: &str, verbs: *mut c_void, v: &str) -> Result<Fns, LoadError> {
    Ok(Fns {
        create_event_channel: bind!(
            cm,
            cm_name,
            c"rdma_create_event_channel" as CreateEventChannel
        ),
        destroy_event_channel: bind!(
            cm,
            cm_name,
            c"rdma_destroy_event_channel" as DestroyEventChannel
        ),
        create_id: bind!(cm, cm_name, c"rdma_create_id" as CreateId),
        destroy_id: bind!(cm, cm_name, c"rdma_destroy_id" as IdFn),
        bind_addr: bind!(cm, cm_name, c"rdma_bind_addr" as BindAddr),
        resolve_addr: bind!(cm, cm_name, c"rdma_resolve_addr" as ResolveAddr),
        resolve_route: bind!(cm, cm_name, c"rdma_resolve_route" as IdIntFn),
        listen: bind!(cm, cm_name, c"rdma_listen" as IdIntFn),
        create_qp: bind!(cm, cm_name, c"rdma_create_qp" as CreateQp),
        destroy_qp: bind!(cm, cm_name, c"rdma_destroy_qp" as DestroyQp),
        connect: bind!(cm, cm_name, c"rdma_connect" as ConnParamFn),
        accept: bind!(cm, cm_name, c"rdma_accept" as ConnParamFn),
        reject: bind!(cm, cm_name, c"rdma_reject" as Reject),
        disconnect: bind!(cm, cm_name, c"rdma_disconnect" as IdFn),
        get_cm_event: bind!(cm, cm_name, c"rdma_get_cm_event" as GetCmEvent),
        ack_cm_event: bind!(cm, cm_name, c"rdma_ack_cm_event" as AckCmEvent),
        set_option: bind!(cm, cm_name, c"rdma_set_option" as SetOption),
        event_str: bind!(cm, cm_name, c"rdma_event_str" as EventStr),
        get_devices: bind!(cm, cm_name, c"rdma_get_devices" as GetDevices),
        free_devices: bind!(cm, cm_name, c"rdma_free_devices" as FreeDevices),
        alloc_pd: bind!(verbs, v, c"ibv_alloc_pd" as AllocPd),
        dealloc_pd: bind!(verbs, v, c"ibv_dealloc_pd" as DeallocPd),
        reg_mr: bind!(verbs, v, c"ibv_reg_mr" as RegMr),
        dereg_mr: bind!(verbs, v, c"ibv_dereg_mr" as DeregMr),
        create_comp_channel: bind!(verbs, v, c"ibv_create_comp_channel" as CreateCompChannel),
        destroy_comp_channel: bind!(verbs, v, c"ibv_destroy_comp_channel" as DestroyCompChannel),
        create_cq: bind!(verbs, v, c"ibv_create_cq" as CreateCq),
        destroy_cq: bind!(verbs, v, c"ibv_destroy_cq" as DestroyCq),
        get_cq_event: bind!(verbs, v, c"ibv_get_cq_event" as GetCqEvent),
        ack_cq_events: bind!(verbs, v, c"ibv_ack_cq_events" as AckCqEvents),
        fork_init: bind!(verbs, v, c"ibv_fork_init" as ForkInit),
        is_fork_initialized: bind_optional!(verbs, c"ibv_is_fork_initialized" as IsForkInitialized),
    })
}

impl Lib {
    /// Loads librdmacm (`name`: a soname or a path) and the libibverbs it uses, and binds every
    /// function. Libraries are never unloaded (see the module docs).
    pub fn load(name: &str) -> Result<Lib, LoadError> {
        let cm = open(name, libc::RTLD_NOW | libc::RTLD_LOCAL)?;
        let (verbs, verbs_name) = open_verbs(name)?;
        let fns = bind_all(cm, name, verbs, &verbs_name)?;
        Ok(Lib {
            name: name.to_owned(),
            fns,
        })
    }

    /// [`Lib::load`] for the rest of the process: the libraries are never unloaded (see the
    /// module docs), so the binding lives as long as they do.
    pub fn load_static(name: &str) -> Result<&'static Lib, LoadError> {
        Lib::load(name).map(|lib| &*Box::leak(Box::new(lib)))
    }

    /// The librdmacm name or path it was loaded from.
    pub fn name(&self) -> &str {
        &self.name
    }

    /// `rdma_event_str`.
    pub fn event_name(&self, event: rdma_cm_event_type::Type) -> String {
        // SAFETY: rdma_event_str returns a pointer to a static NUL-terminated string for any
        // value (unknown ones included).
        let s = unsafe { (self.fns.event_str)(event) };
        if s.is_null() {
            return format!("event {event}");
        }
        // SAFETY: non-null, static and NUL-terminated (see above).
        unsafe { CStr::from_ptr(s) }.to_string_lossy().into_owned()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn nul_and_missing_libraries_are_errors() {
        assert!(matches!(
            Lib::load("a\0b"),
            Err(LoadError::InvalidName { .. })
        ));
        assert!(matches!(
            Lib::load("/nonexistent/librdmacm.so.1"),
            Err(LoadError::Open { .. })
        ));
    }

    #[test]
    fn a_library_without_the_functions_names_the_first_missing_one() {
        match Lib::load("libm.so.6") {
            Err(LoadError::MissingSymbol { symbol, .. }) => {
                assert_eq!(symbol, "rdma_create_event_channel");
            }
            other => panic!("{other:?}"),
        }
    }

    #[test]
    fn the_system_libraries_load_and_bind() {
        // Debian's librdmacm1 and libibverbs1 are installed by `make deps`.
        let lib = Lib::load(DEFAULT_PROVIDER).expect("librdmacm.so.1");
        assert_eq!(
            lib.event_name(rdma_cm_event_type::RDMA_CM_EVENT_ESTABLISHED),
            "RDMA_CM_EVENT_ESTABLISHED"
        );
    }
}
