//! The trait the caller (the supervisor) implements to answer agent -> client
//! requests. Every call runs in its own tokio task, so a slow answer (a human
//! deciding, `terminal/wait_for_exit`) never blocks the read loop.

use std::future::Future;

use serde_json::Value;

use crate::rpc::RpcError;
use crate::types::{
    CreateTerminalRequest, ElicitationRequest, ElicitationResponse, PermissionOutcome,
    PermissionRequest, ReadTextFileRequest, TerminalExitStatus, TerminalOutputResponse,
    TerminalRequest, WriteTextFileRequest,
};

/// Answers the agent's requests. Methods that are not overridden answer
/// `-32601 method not found`. Return `RpcError::invalid_params` (-32602) for a
/// path outside the session boundary, `RpcError::not_found` (-32002) for a
/// missing file or terminal.
///
/// The client answers a pending `request_permission` with `cancelled` itself
/// when the session is cancelled (or the agent sends `$/cancel_request`); the
/// handler's future is then dropped.
pub trait ClientHandler: Send + Sync + 'static {
    /// `session/request_permission`: pick one of `req.selectable_options()`.
    fn request_permission(
        &self,
        req: PermissionRequest,
    ) -> impl Future<Output = Result<PermissionOutcome, RpcError>> + Send;

    /// `fs/read_text_file`: return the content.
    fn read_text_file(
        &self,
        req: ReadTextFileRequest,
    ) -> impl Future<Output = Result<String, RpcError>> + Send {
        let _ = req;
        async { Err(RpcError::method_not_found("fs/read_text_file")) }
    }

    /// `fs/write_text_file`: create or replace the file.
    fn write_text_file(
        &self,
        req: WriteTextFileRequest,
    ) -> impl Future<Output = Result<(), RpcError>> + Send {
        let _ = req;
        async { Err(RpcError::method_not_found("fs/write_text_file")) }
    }

    /// `terminal/create`: start the command in the background, return its id.
    fn create_terminal(
        &self,
        req: CreateTerminalRequest,
    ) -> impl Future<Output = Result<String, RpcError>> + Send {
        let _ = req;
        async { Err(RpcError::method_not_found("terminal/create")) }
    }

    /// `terminal/output`.
    fn terminal_output(
        &self,
        req: TerminalRequest,
    ) -> impl Future<Output = Result<TerminalOutputResponse, RpcError>> + Send {
        let _ = req;
        async { Err(RpcError::method_not_found("terminal/output")) }
    }

    /// `terminal/wait_for_exit` (may take minutes; it has its own task).
    fn wait_for_terminal_exit(
        &self,
        req: TerminalRequest,
    ) -> impl Future<Output = Result<TerminalExitStatus, RpcError>> + Send {
        let _ = req;
        async { Err(RpcError::method_not_found("terminal/wait_for_exit")) }
    }

    /// `terminal/kill` (the id stays valid).
    fn kill_terminal(
        &self,
        req: TerminalRequest,
    ) -> impl Future<Output = Result<(), RpcError>> + Send {
        let _ = req;
        async { Err(RpcError::method_not_found("terminal/kill")) }
    }

    /// `terminal/release` (kill if running, forget the id).
    fn release_terminal(
        &self,
        req: TerminalRequest,
    ) -> impl Future<Output = Result<(), RpcError>> + Send {
        let _ = req;
        async { Err(RpcError::method_not_found("terminal/release")) }
    }

    /// `elicitation/create`: a question for the user (the caller), never the policy.
    fn elicitation(
        &self,
        req: ElicitationRequest,
    ) -> impl Future<Output = Result<ElicitationResponse, RpcError>> + Send {
        let _ = req;
        async { Err(RpcError::method_not_found("elicitation/create")) }
    }

    /// Any other request (extension methods start with `_`).
    fn ext_request(
        &self,
        method: String,
        params: Value,
    ) -> impl Future<Output = Result<Value, RpcError>> + Send {
        let _ = params;
        async move { Err(RpcError::method_not_found(&method)) }
    }
}
