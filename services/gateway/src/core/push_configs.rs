//! Push configs: the four TaskPushNotificationConfig operations, on the caller's own tasks, over
//! the webhook store and checks of `push.rs`.
//!
//! Owns: the ownership check before a config is touched. Must never: deliver a webhook (`push.rs`
//! does, from the live task's changes).

use std::sync::Arc;

use super::shared::Core;
use crate::error::A2aError;
use crate::push::Push;

impl Core {
    /// Turns push notifications on (once; later calls are ignored).
    pub fn set_push(&self, push: Arc<Push>) {
        let _ = self.push.set(push);
    }

    /// The push service, when it is on.
    pub fn push(&self) -> Option<&Arc<Push>> {
        self.push.get().filter(|p| p.enabled())
    }

    pub(super) fn push_or_unsupported(&self) -> Result<&Arc<Push>, A2aError> {
        self.push().ok_or(A2aError::PushNotificationNotSupported)
    }

    /// CreateTaskPushNotificationConfig: checks the webhook and stores it with the task.
    pub async fn create_push_config(
        &self,
        principal: &str,
        cfg: crate::a2a::TaskPushNotificationConfig,
    ) -> Result<crate::a2a::TaskPushNotificationConfig, A2aError> {
        let push = self.push_or_unsupported()?;
        if cfg.task_id.is_empty() {
            return Err(A2aError::InvalidParams("taskId is required".into()));
        }
        let task_id = cfg.task_id.clone();
        self.owned(principal, &task_id).await?;
        let cfg = push.check(principal, Some(&task_id), cfg).await?;
        push.put(principal, cfg.clone()).await?;
        Ok(cfg)
    }

    /// GetTaskPushNotificationConfig.
    pub async fn get_push_config(
        &self,
        principal: &str,
        task_id: &str,
        id: &str,
    ) -> Result<crate::a2a::TaskPushNotificationConfig, A2aError> {
        let push = self.push_or_unsupported()?;
        self.owned(principal, task_id).await?;
        push.get(task_id, id).await
    }

    /// ListTaskPushNotificationConfigs (one page: a task has at most `max_configs_per_task`).
    pub async fn list_push_configs(
        &self,
        principal: &str,
        task_id: &str,
    ) -> Result<crate::a2a::ListTaskPushNotificationConfigsResponse, A2aError> {
        let push = self.push_or_unsupported()?;
        self.owned(principal, task_id).await?;
        Ok(crate::a2a::ListTaskPushNotificationConfigsResponse {
            configs: push.list(task_id).await?,
            next_page_token: String::new(),
        })
    }

    /// DeleteTaskPushNotificationConfig.
    pub async fn delete_push_config(
        &self,
        principal: &str,
        task_id: &str,
        id: &str,
    ) -> Result<(), A2aError> {
        let push = self.push_or_unsupported()?;
        self.owned(principal, task_id).await?;
        push.delete(task_id, id).await
    }
}
