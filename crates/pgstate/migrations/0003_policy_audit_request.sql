-- A withdrawal (PolicyService.Withdraw) reaching a policy replica that did not decide the
-- request finds the newest decision of that request id in the shared audit.
CREATE INDEX policy_audit_request ON policy_audit (request_id, seq);
