//! The A2A core, one module per step of a task's life, in the order a message goes from a binding
//! to the supervisor and back:
//!
//! 1. [`admit`]: SendMessage checked, agent and context claimed, the task recorded (`Core::send`);
//! 2. [`access`]: which agents and workspaces a principal may use, the agent list;
//! 3. [`drive`]: `RunTurn`, and the turn's events followed to the task's end;
//! 4. [`live`]: the task in memory — each event applied, written, announced, in one order;
//!    [`writer`] batches its writes and applies them in order;
//! 5. [`answers`]: a message on an INPUT_REQUIRED task, here or held for another replica;
//! 6. [`cancel`]: CancelTask, never hanging;
//! 7. [`follow`]: SubscribeToTask, following through the store, leases, takeover (`AttachTurn`),
//!    recovery at start;
//! 8. [`read`]: GetTask, ListTasks and the ownership check;
//! 9. [`push_configs`]: the push-config operations;
//! 10. [`sweep`]: retention and the end of idle conversations.
//!
//! [`shared`] holds the handle they all work through ([`Core`]), [`route`] where a context's turns
//! go. A binding sees only what this file re-exports.
//!
//! Must never: spawn a process, decide a permission, or turn a permission into INPUT_REQUIRED.

mod access;
mod admit;
mod answers;
mod cancel;
mod drive;
mod follow;
mod live;
mod push_configs;
mod read;
mod route;
mod shared;
mod sweep;
mod writer;

pub use admit::{MAX_CONTEXT_ID, SendOutcome};
pub use drive::{fault_of_refused_turn, refused_fault};
pub use live::{SUBSCRIBER_BUFFER, SharedEvent, Subscription};
pub use read::apply_history_length;
pub use shared::{AgentAccess, AgentList, Core, CoreSettings, KnownAgent, Retention};
pub use sweep::{ContextClosed, SweepReport};
