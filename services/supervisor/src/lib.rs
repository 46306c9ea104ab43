//! warden-supervisor: owns every agent process. It makes or validates each conversation's root,
//! spawns the agent contained (`warden-sandbox`), speaks ACP to it (`warden-acp`), runs one turn
//! at a time per conversation (FIFO, cancel by id), enforces quotas, and for every
//! `session/request_permission` asks `PolicyService.Decide` and answers with one of the options
//! the agent offered (`warden-rules` option choice). It keeps bounded transcripts, sanitized
//! incident records and a health line per turn under its state directory.
//!
//! Must never: decide a permission itself (it enforces; the policy decides — and a slow, failing
//! or malformed policy answer is a DENY), route a permission to the caller or a question to the
//! policy, send an option id the agent did not offer or an "always" option, turn a caller's
//! string into a path, leave an agent process behind after close, cancel, timeout or a crash
//! (leases are reaped at start-up), or write argv/environment into any record.
#![forbid(unsafe_code)]

// Layers, each importing only those below it (ARCHITECTURE.md draws them):
//   config, adapters, records, fault, metrics, policy, translate, mode, options, patch, copy, fair, live,
//   admission, cell                                    leaves (live, admission: over fair; cell:
//                                                      the registry row, figures handed in)
//   egress                                             an agent's egress proxy (reports through a trait)
//   turn                                               a turn's state and event stream
//   shared                                             the daemon-wide context
//   terminal                                           ACP terminals (a narrow context)
//   servant                                            the fs servant (fs/* with the agent's rights)
//   core                                               one conversation's shared state
//   bridge                                             the ACP handler (agent -> supervisor)
//   agent                                              spawn + handshake of one agent
//   pool                                               warm agents waiting for a conversation
//   conversation                                       the turn queue and drive loop
//   service                                            the gRPC services and the registry
pub mod adapters;
pub mod admission;
pub mod agent;
pub mod batch;
pub mod bridge;
pub mod cell;
pub mod config;
pub mod conversation;
pub mod copy;
pub mod core;
pub mod decide_stream;
pub mod egress;
pub mod fair;
pub mod fault;
pub mod live;
pub mod metrics;
pub mod mode;
pub mod options;
pub mod patch;
pub mod policy;
pub mod pool;
pub mod records;
pub mod servant;
pub mod service;
pub mod shared;
pub mod terminal;
pub mod translate;
pub mod turn;
