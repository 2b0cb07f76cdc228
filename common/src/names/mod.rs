//! Kubernetes names: the project's fixed names ([`contract`]) and the one rule for extended
//! resource names ([`validate_extended_resource_name`]) that the device plugin and the injector
//! both apply, so that the injector never asks for a resource the plugin cannot register.

pub mod contract;
mod resource;
mod syntax;

pub use resource::{ResourceNameError, validate_extended_resource_name};
pub use syntax::{is_dns1123_label, is_dns1123_subdomain};
