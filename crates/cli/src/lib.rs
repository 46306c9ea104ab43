//! The `warden` command's library half: the local deployment's layout, the `up`/`status` logic
//! and the gateway client of `send`, shared with the end-to-end test harness so tests start daemons exactly as `warden up` does.
//!
//! Must never: decide a permission, spawn an agent, or read another daemon's store directly —
//! everything goes through the daemons' public interfaces.

pub mod agents;
pub mod approvals;
pub mod audit;
pub mod client;
pub mod deployed;
pub mod doctor;
pub mod git_apply;
pub mod init;
pub mod layout;
pub mod logs;
pub mod mcp;
pub mod output;
pub mod status;
pub mod token;
pub mod up;
