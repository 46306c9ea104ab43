//! `bind_workspace`: a scope bound to a workspace, chosen by the caller through an elicitation
//! form (or proposed and confirmed), remembered until it closes.
//!
//! Owns: the binding of a scope to a workspace. Must never: bind a workspace the caller may not
//! use, or take a path from the caller.

use super::*;

pub(super) fn bind_form(candidates: &[WorkspaceInfo], proposed: bool) -> (String, Value) {
    if let [one] = candidates {
        let who = if proposed {
            "The MCP client (a model) PROPOSED this folder; you did not type it."
        } else {
            "This is the only workspace the operator allows."
        };
        (
            format!(
                "{who}\nBind warden's agents (advise, review, implement) to exactly:\n\n    {}\n\n(operator workspace \"{}\"). Confirm only if this is the folder you want them to work in.",
                one.path, one.name
            ),
            json!({"type": "object", "properties": {"confirm": {"type": "boolean", "title": format!("Bind to {}", one.path), "default": false}}, "required": ["confirm"]}),
        )
    } else {
        let paths: Vec<&str> = candidates.iter().map(|w| w.path.as_str()).collect();
        (
            "Choose the workspace warden's agents (advise, review, implement) should work in; these are the ones the operator allows.".into(),
            json!({"type": "object", "properties": {
                "path": {"type": "string", "title": "Workspace", "enum": paths},
                "confirm": {"type": "boolean", "title": "Bind to the chosen path", "default": false}
            }, "required": ["path", "confirm"]}),
        )
    }
}

/// What the human's answer binds, if anything.
pub(super) fn chosen(
    candidates: &[WorkspaceInfo],
    r: &ElicitResult,
) -> Result<WorkspaceInfo, String> {
    match r.action {
        ElicitationAction::Accept => {}
        ElicitationAction::Decline => return Err("the human declined; nothing is bound".into()),
        _ => return Err("the human cancelled; nothing is bound".into()),
    }
    let c = r.content.as_ref().and_then(Value::as_object);
    if c.and_then(|c| c.get("confirm")).and_then(Value::as_bool) != Some(true) {
        return Err("the binding was not confirmed; nothing is bound".into());
    }
    let picked = match candidates {
        [one] => Some(one),
        many => c
            .and_then(|c| c.get("path"))
            .and_then(Value::as_str)
            .and_then(|p| many.iter().find(|w| w.path == p)),
    };
    picked
        .cloned()
        .ok_or_else(|| "the answer named no offered workspace; nothing is bound".into())
}

pub(super) fn bind_result(b: Option<&Binding>, message: String) -> CallToolResult {
    json_result(
        json!({"bound": b.is_some(), "binding": b.map(|b| serde_json::to_value(b).unwrap_or(Value::Null)), "message": message}),
        b.is_none(),
    )
}

impl McpFront {
    pub(super) fn bind(&self, scope: &Scope, w: &WorkspaceInfo) -> Binding {
        let b = Binding {
            workspace: w.name.clone(),
            path: w.path.clone(),
            identity: w.identity.clone(),
            fingerprint: workspace::fingerprint(w),
            bound_at: crate::time::format_micros(crate::time::now_micros()),
        };
        *lock(&scope.binding) = Some(b.clone());
        b
    }

    pub(super) async fn bind_workspace(
        &self,
        req: &CallToolRequestParams,
        args: &Map<String, Value>,
        caller: &Caller,
        scope_key: &str,
        ctx: &RequestContext<RoleServer>,
    ) -> CallToolResponse {
        let scope = self.scope(scope_key);
        // A stateless retry carrying the human's answer (MRTR).
        if let (Some(state), Some(responses)) = (&req.request_state, &req.input_responses) {
            // The handle is its owner's: checked before it is used up, so a leaked one
            // presented by another caller changes nothing.
            let pending = {
                let mut m = lock(&self.pending);
                let mine = m.get(state).is_some_and(|p| {
                    p.principal == caller.identity.principal && p.scope == scope_key
                });
                if mine { m.remove(state) } else { None }
            };
            let Some(p) = pending.filter(|p| p.at.elapsed() < PENDING_BIND_TTL) else {
                return bind_result(
                    None,
                    "this bind request expired or is unknown; call bind_workspace again".into(),
                )
                .into();
            };
            let answer = responses
                .get("confirm")
                .and_then(|v| serde_json::from_value::<ElicitResult>(v.clone()).ok());
            return match answer
                .ok_or_else(|| {
                    "no answer to the confirmation was sent; nothing is bound".to_string()
                })
                .and_then(|r| chosen(&p.candidates, &r))
            {
                Ok(w) => {
                    let b = self.bind(&scope, &w);
                    tracing::info!(principal = %caller.identity.principal, workspace = %b.workspace, path = %b.path, "MCP workspace bound");
                    bind_result(Some(&b), format!("bound to {}", b.path)).into()
                }
                Err(e) => bind_result(None, e).into(),
            };
        }
        // Rebinding clears the previous binding at once, whatever comes of this call, and a
        // confirmation still pending from an earlier call can no longer bind.
        *lock(&scope.binding) = None;
        lock(&self.pending).retain(|_, p| p.scope != scope_key);
        if let Err((_, why)) = tools::check_names(args, &["proposed_path"]) {
            return bind_result(None, why).into();
        }
        // Only the workspaces this caller may use are offered, matched or named in a refusal.
        let allowed = match self.workspaces().await {
            Ok(w) => w
                .into_iter()
                .filter(|w| self.core.may_use_workspace(&caller.identity, &w.name))
                .collect::<Vec<_>>(),
            Err(e) => return bind_result(None, e).into(),
        };
        let proposed = match args.get("proposed_path") {
            None | Some(Value::Null) => None,
            Some(Value::String(s)) => Some(s.clone()),
            Some(_) => return bind_result(None, "proposed_path must be a string".into()).into(),
        };
        let candidates = match &proposed {
            Some(p) => match workspace::match_proposed(p, &allowed) {
                Ok(w) => vec![w],
                Err(e) => {
                    tracing::info!(principal = %caller.identity.principal, proposed = %p, reason = %e, "MCP bind refused");
                    return bind_result(None, e).into();
                }
            },
            None if allowed.is_empty() => {
                return bind_result(
                    None,
                    "no workspace is available to you (the supervisor's [workspaces], the gateway's [[agents.access]])"
                        .into(),
                )
                .into();
            }
            None => allowed,
        };
        if !can_elicit(ctx) {
            return bind_result(
                None,
                "binding needs the human's confirmation through MCP elicitation, and this client did not declare the elicitation capability; nothing is bound".into(),
            )
            .into();
        }
        let (message, form) = bind_form(&candidates, proposed.is_some());
        let Some(requested_schema) = schema(form) else {
            return bind_result(None, "internal: bad confirmation form".into()).into();
        };
        let params = ElicitRequestParams::FormElicitationParams {
            meta: None,
            message,
            requested_schema,
        };
        if stateless(ctx) {
            let handle = uuid::Uuid::new_v4().to_string();
            let mut pending = lock(&self.pending);
            pending.retain(|_, p| p.at.elapsed() < PENDING_BIND_TTL);
            pending.insert(
                handle.clone(),
                PendingBind {
                    principal: caller.identity.principal.clone(),
                    scope: scope_key.to_string(),
                    candidates,
                    at: Instant::now(),
                },
            );
            let mut asks = std::collections::BTreeMap::new();
            asks.insert(
                "confirm".to_string(),
                InputRequest::Elicitation(ElicitRequest::new(params)),
            );
            return CallToolResponse::InputRequired(InputRequiredResult::new(
                Some(asks),
                Some(handle),
            ));
        }
        match ctx.peer.create_elicitation(params).await {
            Ok(r) => match chosen(&candidates, &r) {
                Ok(w) => {
                    let b = self.bind(&scope, &w);
                    tracing::info!(principal = %caller.identity.principal, workspace = %b.workspace, path = %b.path, "MCP workspace bound");
                    bind_result(Some(&b), format!("bound to {}", b.path)).into()
                }
                Err(e) => bind_result(None, e).into(),
            },
            Err(e) => bind_result(
                None,
                format!("the confirmation could not be asked: {e}; nothing is bound"),
            )
            .into(),
        }
    }
}
