//! Reads: GetTask and ListTasks, a live task answered from memory and any other from the store,
//! and the ownership check every operation on an existing task starts with ([`Core::owned`]).
//!
//! Owns: paging, filters and `historyLength`. Must never: tell a caller whether another
//! principal's task exists.

use std::sync::Arc;

use super::live::{LiveTask, lock};
use super::shared::{Core, store_err};
use crate::a2a::{ListTasksRequest, ListTasksResponse, Task, TaskState};
use crate::error::A2aError;
use crate::store::TaskRecord;
use crate::time::parse_rfc3339;

/// Trims a task's history to the `historyLength` the caller asked for.
pub fn apply_history_length(task: &mut Task, history_length: Option<i32>) -> Result<(), A2aError> {
    match history_length {
        None => {}
        Some(n) if n < 0 => {
            return Err(A2aError::InvalidParams(
                "historyLength must not be negative".into(),
            ));
        }
        Some(n) => {
            let n = n as usize;
            if task.history.len() > n {
                task.history.drain(..task.history.len() - n);
            }
        }
    }
    Ok(())
}

impl Core {
    /// Loads a task the principal may see (TaskNotFound otherwise, whether or not it exists).
    pub(super) async fn owned(
        &self,
        principal: &str,
        id: &str,
    ) -> Result<(Task, TaskRecord), A2aError> {
        if let Some(live) = self.live(id) {
            let inner = lock(&live.inner);
            if inner.record.principal == principal {
                let mut rec = inner.record.clone();
                rec.task.status = inner.task.status.clone();
                return Ok((inner.task.clone(), rec));
            }
            return Err(A2aError::TaskNotFound(id.to_string()));
        }
        match self.store.load(id).await.map_err(store_err)? {
            Some((task, rec)) if rec.principal == principal => Ok((task, rec)),
            _ => Err(A2aError::TaskNotFound(id.to_string())),
        }
    }

    /// GetTask.
    pub async fn get(
        &self,
        principal: &str,
        id: &str,
        history_length: Option<i32>,
    ) -> Result<Task, A2aError> {
        if history_length.is_some_and(|n| n < 0) {
            return Err(A2aError::InvalidParams(
                "historyLength must not be negative".into(),
            ));
        }
        let (mut task, _) = self.owned(principal, id).await?;
        apply_history_length(&mut task, history_length)?;
        Ok(task)
    }

    /// ListTasks: the principal's tasks, newest status first.
    pub async fn list(
        &self,
        principal: &str,
        req: &ListTasksRequest,
    ) -> Result<ListTasksResponse, A2aError> {
        let page_size = match req.page_size {
            None => 50,
            Some(n) if (1..=100).contains(&n) => n as usize,
            Some(n) => {
                return Err(A2aError::InvalidParams(format!(
                    "pageSize must be between 1 and 100, not {n}"
                )));
            }
        };
        let offset = match req.page_token.as_deref() {
            None | Some("") => 0,
            Some(t) => t
                .parse::<usize>()
                .map_err(|_| A2aError::InvalidParams(format!("invalid pageToken {t:?}")))?,
        };
        let after = match req.status_timestamp_after.as_deref() {
            None | Some("") => None,
            Some(t) => Some(parse_rfc3339(t).ok_or_else(|| {
                A2aError::InvalidParams(format!(
                    "statusTimestampAfter {t:?} is not an ISO 8601 UTC timestamp"
                ))
            })?),
        };
        if let Some(n) = req.history_length
            && n < 0
        {
            return Err(A2aError::InvalidParams(
                "historyLength must not be negative".into(),
            ));
        }
        // A live task's stored head may lag its last status by a batch: it is listed as the
        // live task stands.
        let mut heads: Vec<(TaskRecord, Option<Arc<LiveTask>>)> = self
            .store
            .heads_of(principal)
            .await
            .map_err(store_err)?
            .into_iter()
            .map(|r| match self.live(&r.task.id) {
                Some(live) => {
                    let inner = lock(&live.inner);
                    let mut rec = inner.record.clone();
                    rec.task.status = inner.task.status.clone();
                    drop(inner);
                    (rec, Some(live))
                }
                None => (r, None),
            })
            .filter(|(r, _)| r.principal == principal)
            .filter(|(r, _)| {
                req.context_id
                    .as_deref()
                    .is_none_or(|c| c.is_empty() || r.task.context_id == c)
            })
            .filter(|(r, _)| {
                req.status
                    .is_none_or(|s| s == TaskState::Unspecified || r.task.status.state == s)
            })
            .filter(|(r, _)| after.is_none_or(|a| r.status_micros >= a))
            .collect();
        heads.sort_by(|(a, _), (b, _)| {
            b.status_micros
                .cmp(&a.status_micros)
                .then_with(|| a.task.id.cmp(&b.task.id))
        });
        let total = heads.len();
        let include_artifacts = req.include_artifacts.unwrap_or(false);
        let mut tasks = Vec::new();
        for (rec, live) in heads.iter().skip(offset).take(page_size) {
            let mut task = match live {
                Some(live) => {
                    let inner = lock(&live.inner);
                    let mut task = inner.task.clone();
                    if !include_artifacts {
                        task.artifacts.clear();
                    }
                    task
                }
                None => {
                    let mut task = rec.task.clone();
                    task.history = self.store.history(&task.id).await.map_err(store_err)?;
                    if include_artifacts {
                        task.artifacts = self.store.artifacts(&task.id).await.map_err(store_err)?;
                    }
                    task
                }
            };
            apply_history_length(&mut task, req.history_length)?;
            tasks.push(task);
        }
        let next = offset + tasks.len();
        Ok(ListTasksResponse {
            next_page_token: if next < total {
                next.to_string()
            } else {
                String::new()
            },
            page_size: page_size as i32,
            total_size: total as i32,
            tasks,
        })
    }
}
