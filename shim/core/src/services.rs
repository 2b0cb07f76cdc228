//! `STREAMSHIM_SERVICE_CIDRS`: the cluster's virtual IPs (Kubernetes Service CIDRs). A
//! connection to a ClusterIP reaches its backend pod through the kernel's NAT, which only the
//! TCP connection passes: an RDMA connect to the virtual IP gets no answer and costs the
//! process one negotiation bound per destination every 60 s (`TIMEOUT`, then
//! `NEGATIVE_CACHE`). A client connect to an address in one of these networks stays TCP at
//! once instead, counted `SERVICE_IP`. The chart sets the variable from `shim.serviceCIDRs`
//! (docs/shim.md, "Kubernetes Services").

use std::ffi::OsStr;
use std::net::IpAddr;
use std::sync::OnceLock;

use crate::policy::Cidr;
use crate::settings::SERVICE_CIDRS_ENV;

/// Most networks the variable may list (a cluster has one per family, a few after a resize).
pub const MAX_CIDRS: usize = 16;

/// The networks of the cluster's virtual IPs.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ServiceCidrs(Vec<Cidr>);

impl ServiceCidrs {
    /// Whether `ip` (IPv4-mapped forms included) is in one of the networks.
    pub fn contains(&self, ip: IpAddr) -> bool {
        self.0.iter().any(|c| c.contains(ip))
    }

    /// No network listed.
    pub fn is_empty(&self) -> bool {
        self.0.is_empty()
    }
}

/// The networks for the variable's value: CIDRs separated by commas or white space (unset or
/// blank: none). A value with an entry that is not a CIDR, or with more than [`MAX_CIDRS`], is
/// an error as a whole (the caller says so once and knows no network: connections to them are
/// negotiated as before, which costs time but breaks nothing).
pub fn from_value(value: Option<&OsStr>) -> Result<ServiceCidrs, String> {
    let Some(raw) = value else {
        return Ok(ServiceCidrs::default());
    };
    let Some(text) = raw.to_str() else {
        return Err(format!("{SERVICE_CIDRS_ENV} is not UTF-8"));
    };
    let entries: Vec<&str> = text
        .split(|c: char| c == ',' || c.is_whitespace())
        .filter(|e| !e.is_empty())
        .collect();
    if entries.len() > MAX_CIDRS {
        return Err(format!(
            "{SERVICE_CIDRS_ENV} lists {} networks (at most {MAX_CIDRS})",
            entries.len()
        ));
    }
    entries
        .into_iter()
        .map(|e| {
            e.parse::<Cidr>()
                .map_err(|err| format!("{SERVICE_CIDRS_ENV}: {err}"))
        })
        .collect::<Result<Vec<_>, _>>()
        .map(ServiceCidrs)
}

/// The networks of a capable process (set once, at the decision).
static SERVICES: OnceLock<ServiceCidrs> = OnceLock::new();

/// Sets the process's networks (the decision; later calls change nothing).
pub fn set(cidrs: ServiceCidrs) {
    let _ = SERVICES.set(cidrs);
}

/// Whether a connect to `ip` is a connect to a virtual IP of the cluster.
pub fn is_service_ip(ip: IpAddr) -> bool {
    SERVICES.get().is_some_and(|s| s.contains(ip))
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::ffi::OsString;
    use std::os::unix::ffi::OsStringExt;

    fn parse(v: &str) -> Result<ServiceCidrs, String> {
        from_value(Some(OsStr::new(v)))
    }

    fn ip(s: &str) -> IpAddr {
        s.parse().unwrap()
    }

    #[test]
    fn unset_or_blank_lists_nothing() {
        assert_eq!(from_value(None), Ok(ServiceCidrs::default()));
        assert!(parse("").unwrap().is_empty());
        assert!(parse(" , \n").unwrap().is_empty());
    }

    #[test]
    fn commas_and_spaces_separate_both_families() {
        let s = parse("10.96.0.0/12, fd00:10:96::/112\t172.30.0.0/16").unwrap();
        assert!(s.contains(ip("10.96.0.10")));
        assert!(s.contains(ip("10.111.255.254")));
        assert!(!s.contains(ip("10.112.0.1")), "outside the /12");
        assert!(s.contains(ip("::ffff:10.96.0.1")), "IPv4-mapped");
        assert!(s.contains(ip("fd00:10:96::a")));
        assert!(s.contains(ip("172.30.1.2")));
        assert!(!s.contains(ip("10.244.1.7")), "a pod IP");
    }

    #[test]
    fn a_bad_entry_or_too_many_is_an_error_naming_the_variable() {
        for bad in [
            "10.96.0.0/33",
            "10.96.0.0/12,nope",
            "10.96/12",
            "10.96.0.0/12;",
        ] {
            let e = parse(bad).unwrap_err();
            assert!(e.starts_with(SERVICE_CIDRS_ENV), "{bad}: {e}");
        }
        let many = vec!["10.0.0.0/8"; MAX_CIDRS + 1].join(",");
        assert!(parse(&many).unwrap_err().contains("at most"));
        let latin1 = OsString::from_vec(vec![b'1', 0xff]);
        assert!(from_value(Some(&latin1)).is_err());
    }
}
