//! The handler an agent's ACP connection calls before and after it has a conversation
//! ([`Binding`]): unbound, every request refused and counted; bound, handed to the
//! conversation's core.
//!
//! Owns: the agent's link to its conversation. Must never: let a request of an unbound agent reach
//! the policy, a file or the caller.

use super::*;

/// The handler an agent's ACP connection calls: its conversation's core, once the agent has
/// one. A conversation's own start binds it at once; a warm agent of the pool (`pool.rs`) is
/// connected unbound and bound when a conversation takes it. Until then every request the agent
/// makes is refused — a permission `cancelled`, a question cancelled, everything else an error —
/// without reaching the policy or any file, and so is every connection to its egress proxy
/// (`conversation`), and counted: an agent that asked for anything
/// before it was given a conversation is never handed to one.
#[derive(Default)]
pub struct Binding {
    core: std::sync::OnceLock<Arc<ConvCore>>,
    early: std::sync::atomic::AtomicU32,
}

impl Binding {
    /// Bound to `core` from the start.
    pub fn bound(core: Arc<ConvCore>) -> Arc<Binding> {
        let b = Binding::default();
        let _ = b.core.set(core);
        Arc::new(b)
    }

    /// Not bound yet (a warm agent).
    pub fn unbound() -> Arc<Binding> {
        Arc::new(Binding::default())
    }

    /// Binds the conversation; false when it was bound already (never rebound).
    pub fn bind(&self, core: Arc<ConvCore>) -> bool {
        self.core.set(core).is_ok()
    }

    /// Requests the agent made while unbound (all refused).
    pub fn early_requests(&self) -> u32 {
        self.early.load(std::sync::atomic::Ordering::Relaxed)
    }

    /// The conversation bound, for what the agent does outside ACP (its egress proxy's
    /// connections): None while unbound, and then counted among the early requests like a
    /// refused ACP request.
    pub fn conversation(&self, what: &str) -> Option<&Arc<ConvCore>> {
        self.core(what).ok()
    }

    fn core(&self, method: &str) -> Result<&Arc<ConvCore>, RpcError> {
        match self.core.get() {
            Some(c) => Ok(c),
            None => {
                self.early
                    .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                tracing::warn!(
                    method,
                    "a warm agent made a request before it had a conversation: refused"
                );
                Err(RpcError::invalid_params(
                    "this agent has no conversation yet: nothing is served",
                ))
            }
        }
    }
}

impl ClientHandler for Binding {
    async fn request_permission(
        &self,
        req: PermissionRequest,
    ) -> Result<PermissionOutcome, RpcError> {
        match self.core("session/request_permission") {
            Ok(c) => c.request_permission(req).await,
            Err(_) => Ok(PermissionOutcome::Cancelled),
        }
    }

    async fn read_text_file(&self, req: ReadTextFileRequest) -> Result<String, RpcError> {
        self.core("fs/read_text_file")?.read_text_file(req).await
    }

    async fn write_text_file(&self, req: WriteTextFileRequest) -> Result<(), RpcError> {
        self.core("fs/write_text_file")?.write_text_file(req).await
    }

    async fn create_terminal(
        &self,
        req: warden_acp::CreateTerminalRequest,
    ) -> Result<String, RpcError> {
        self.core("terminal/create")?.create_terminal(req).await
    }

    async fn terminal_output(
        &self,
        req: warden_acp::TerminalRequest,
    ) -> Result<warden_acp::TerminalOutputResponse, RpcError> {
        self.core("terminal/output")?.terminal_output(req).await
    }

    async fn wait_for_terminal_exit(
        &self,
        req: warden_acp::TerminalRequest,
    ) -> Result<warden_acp::TerminalExitStatus, RpcError> {
        self.core("terminal/wait_for_exit")?
            .wait_for_terminal_exit(req)
            .await
    }

    async fn kill_terminal(&self, req: warden_acp::TerminalRequest) -> Result<(), RpcError> {
        self.core("terminal/kill")?.kill_terminal(req).await
    }

    async fn release_terminal(&self, req: warden_acp::TerminalRequest) -> Result<(), RpcError> {
        self.core("terminal/release")?.release_terminal(req).await
    }

    async fn elicitation(&self, req: ElicitationRequest) -> Result<ElicitationResponse, RpcError> {
        match self.core("elicitation/create") {
            Ok(c) => c.elicitation(req).await,
            Err(_) => Ok(ElicitationResponse::Cancel),
        }
    }

    async fn ext_request(
        &self,
        method: String,
        params: serde_json::Value,
    ) -> Result<serde_json::Value, RpcError> {
        self.core(&method)?.ext_request(method, params).await
    }
}
