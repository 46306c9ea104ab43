//! Where a context's turns go: the one supervisor, or in `[cells]` mode the cell its context is
//! placed on ([`Core::route`]), and the client for calls on a placed context.
//!
//! Owns: the choice of supervisor for a call. Must never: place a context itself (`cells.rs`
//! does) or read a task.

use std::sync::Arc;

use tonic::transport::Channel;
use warden_proto::v1::supervisor_service_client::SupervisorServiceClient;

use super::shared::Core;

impl Core {
    /// Turns go to cells placed per context instead of the one supervisor (once).
    pub fn set_cells(&self, cells: Arc<crate::cells::Cells>) {
        let _ = self.cells.set(cells);
    }

    /// Where `context_id`'s turns go: the one supervisor, or its cell (placed first for
    /// `place`, the principal whose turn it is, when it has none or its cell was lost). The
    /// fault says why there is nowhere.
    pub async fn route(
        &self,
        context_id: &str,
        place: Option<&str>,
    ) -> Result<crate::cells::Routed, warden_proto::v1::Fault> {
        use warden_proto::v1::{Fault, FaultClass};
        let Some(cells) = self.cells.get() else {
            return Ok(crate::cells::Routed::single(self.supervisor.clone()));
        };
        let unavailable = |message: String| Fault {
            class: "supervisor".into(),
            message,
            fault_class: FaultClass::SupervisorUnavailable as i32,
        };
        match cells.route(context_id, place).await {
            Ok(Some(r)) => Ok(r),
            Ok(None) if place.is_some() => Err(unavailable(
                "no live cell takes new conversations now (every cell is lost or draining)".into(),
            )),
            Ok(None) => Err(Fault {
                class: "cell-lost".into(),
                message: format!("context {context_id} is on no live cell"),
                fault_class: FaultClass::CellLost as i32,
            }),
            Err(e) => Err(unavailable(format!(
                "cannot read the context's placement: {e}"
            ))),
        }
    }

    /// The client of `context_id`'s supervisor for a call on a placed context (cancel, answer,
    /// close): the one supervisor, or its cell.
    pub(super) async fn supervisor_of(
        &self,
        context_id: &str,
    ) -> Result<SupervisorServiceClient<Channel>, tonic::Status> {
        self.route(context_id, None)
            .await
            .map(|r| r.client)
            .map_err(|f| match f.fault_class() {
                // Its cell is lost: nothing of the conversation is reachable any more.
                warden_proto::v1::FaultClass::CellLost => tonic::Status::not_found(f.message),
                _ => tonic::Status::unavailable(f.message),
            })
    }

    /// The supervisor client for what any supervisor answers alike (agents, workspaces): the
    /// one supervisor, or any live cell. A context's turns go through [`Core::route`].
    pub fn supervisor(&self) -> SupervisorServiceClient<Channel> {
        self.cells
            .get()
            .and_then(|c| c.any())
            .map(|r| r.client)
            .unwrap_or_else(|| self.supervisor.clone())
    }
}
