//! Capture (source role): find virt-handler's network namespace and enter it ([`netns`]),
//! redirect a migration's connections there with a table of its own ([`nft`]), and receive
//! them on a listener opened in that namespace (`listener`). Nothing here knows a migration's
//! state: [`crate::migration`] drives it.

pub(crate) mod addresses;
mod listener;
pub(crate) mod netns;
mod nfnetlink;
pub(crate) mod nft;

pub(crate) use listener::{CaptureError, listen_in, original_destination};
