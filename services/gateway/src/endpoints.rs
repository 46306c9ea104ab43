//! Where each binding is served and what it is called: the paths, media types and binding names
//! the card advertises and the bindings answer on.
//!
//! Owns: these names only (the bottom floor: it imports nothing). Must never: hold logic, so
//! that the card, push delivery, the server and every binding can share them without importing
//! one another.

/// The JSON-RPC interface's path (also served with a trailing slash and at `/`).
pub const JSONRPC_PATH: &str = "/a2a/jsonrpc";
/// The HTTP+JSON interface's base path (its routes are also served at the root).
pub const REST_PATH: &str = "/a2a/rest";
/// The agent card's well-known path.
pub const CARD_PATH: &str = "/.well-known/agent-card.json";

/// The HTTP+JSON binding's media type for its bodies (spec 1.0.1 §11: `application/a2a+json`
/// SHOULD be used for requests and responses); JSON-RPC and the card stay `application/json`.
/// Webhook deliveries carry it too.
pub const A2A_JSON: &str = "application/a2a+json";

/// The protocol binding names on the card.
pub const JSONRPC_BINDING: &str = "JSONRPC";
pub const REST_BINDING: &str = "HTTP+JSON";
pub const GRPC_BINDING: &str = "GRPC";
