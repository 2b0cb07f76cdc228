//! Tests of the pure core: table tests over pod fixtures, invariants after every patch,
//! idempotency and reinvocation, property tests, hostile pods (fuzz), and schema validation
//! with `kubernetes-validate`.
//!
//! Fixtures live in `injector/tests/data/pods/*.json`, the profiles in
//! `injector/tests/data/config/profiles.yaml`; both are compiled in with `include_str!`.

mod fuzz;
mod invariants;
mod props;
mod reinvocation;
mod support;
mod table;
mod validate;
