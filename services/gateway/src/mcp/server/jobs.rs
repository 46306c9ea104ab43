//! Background jobs of the MCP front: a verb started with `background`, its progress kept (bounded),
//! looked up, pruned and cancelled by its principal.
//!
//! Owns: a job's life and its view. Must never: show a job to another principal.

use super::*;

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "lowercase")]
pub(super) enum JobState {
    Running,
    Finished,
    Cancelled,
}

pub(super) struct JobInner {
    pub(super) state: JobState,
    progress: VecDeque<String>,
    result: Option<Value>,
    finished: Option<Instant>,
}

pub(super) struct Job {
    id: String,
    principal: String,
    pub(super) context_id: Mutex<Option<String>>,
    cancel: CancellationToken,
    pub(super) inner: Mutex<JobInner>,
    done: tokio::sync::Notify,
}

/// Progress lines kept per job.
pub(super) const JOB_PROGRESS: usize = 32;

impl McpFront {
    pub(super) fn job_view(j: &Job) -> Value {
        let i = lock(&j.inner);
        json!({"job_id": j.id, "state": i.state, "progress": i.progress.iter().collect::<Vec<_>>(), "result": i.result})
    }

    pub(super) fn prune_jobs(&self) {
        let keep = Duration::from_secs(self.cfg.job_retention_seconds);
        lock(&self.jobs).retain(|_, j| lock(&j.inner).finished.is_none_or(|f| f.elapsed() < keep));
    }

    pub(super) fn job(
        &self,
        principal: &str,
        args: &Map<String, Value>,
    ) -> Result<Arc<Job>, CallToolResult> {
        if let Err((_, why)) = tools::check_names(args, &["job_id"]) {
            return Err(json_result(
                json!({"job_id": "", "state": "finished", "result": null, "error": why}),
                true,
            ));
        }
        let id = args.get("job_id").and_then(Value::as_str).unwrap_or("");
        lock(&self.jobs)
            .get(id)
            .filter(|j| j.principal == principal)
            .cloned()
            .ok_or_else(|| {
                json_result(
                    json!({"job_id": id, "state": "finished", "result": null, "error": format!("no job {id:?} of yours")}),
                    true,
                )
            })
    }

    pub(super) fn start_job(
        self: &Arc<Self>,
        args: VerbArgs,
        caller: Caller,
        scope_key: String,
    ) -> CallToolResult {
        self.prune_jobs();
        let mine = lock(&self.jobs)
            .values()
            .filter(|j| j.principal == caller.identity.principal)
            .count();
        if mine >= self.cfg.max_jobs {
            return json_result(
                json!({"job_id": "", "state": "finished", "result": null,
                       "error": format!("at most {} jobs per caller are kept; wait for one to finish or for its result to expire", self.cfg.max_jobs)}),
                true,
            );
        }
        let job = Arc::new(Job {
            id: uuid::Uuid::new_v4().to_string(),
            principal: caller.identity.principal.clone(),
            context_id: Mutex::new(None),
            cancel: CancellationToken::new(),
            inner: Mutex::new(JobInner {
                state: JobState::Running,
                progress: VecDeque::new(),
                result: None,
                finished: None,
            }),
            done: tokio::sync::Notify::new(),
        });
        lock(&self.jobs).insert(job.id.clone(), job.clone());
        let front = self.clone();
        let j = job.clone();
        tokio::spawn(async move {
            let scope = front.scope(&scope_key);
            let pj = j.clone();
            let progress: Arc<Progress> = Arc::new(move |line| {
                let mut i = lock(&pj.inner);
                i.progress.push_back(line);
                while i.progress.len() > JOB_PROGRESS {
                    i.progress.pop_front();
                }
            });
            // Nobody waits on a background job's request: a question is declined (and reported).
            let ask: Arc<Ask> = Arc::new(|_| futures::future::ready(None).boxed());
            let cj = j.clone();
            let on_context = move |c: &str| *lock(&cj.context_id) = Some(c.to_string());
            let e = front
                .run_verb(
                    Verb::Implement,
                    args,
                    &caller,
                    &scope,
                    j.id.clone(),
                    &*ask,
                    &*progress,
                    j.cancel.clone(),
                    &on_context,
                )
                .await;
            {
                let mut i = lock(&j.inner);
                i.state = if j.cancel.is_cancelled() {
                    JobState::Cancelled
                } else {
                    JobState::Finished
                };
                i.result = Some(e.to_value());
                i.finished = Some(Instant::now());
            }
            j.done.notify_waiters();
        });
        json_result(Self::job_view(&job), false)
    }

    pub(super) async fn cancel_job(&self, j: Arc<Job>) -> CallToolResult {
        let done = j.done.notified();
        tokio::pin!(done);
        done.as_mut().enable();
        j.cancel.cancel();
        if lock(&j.inner).state == JobState::Running {
            let _ = tokio::time::timeout(self.cancel_grace + Duration::from_secs(5), done).await;
        }
        json_result(Self::job_view(&j), false)
    }
}
