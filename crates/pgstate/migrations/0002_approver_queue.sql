-- warden-approver's pending/answered queue, shared by its replicas. `approval` is the
-- prost-encoded warden.v1.Approval; `state` mirrors its state (0 = pending) so that the first
-- answer wins with one conditional UPDATE ... WHERE state = 0.
CREATE TABLE approver_approvals (
    id               TEXT   PRIMARY KEY,
    request_id       TEXT   NOT NULL,
    state            INT    NOT NULL,
    created_unix_ms  BIGINT NOT NULL,
    answered_unix_ms BIGINT NOT NULL DEFAULT 0,
    approval         BYTEA  NOT NULL
);
-- A supervisor's retried request finds the approval already held (on any replica).
CREATE UNIQUE INDEX approver_approvals_request ON approver_approvals (request_id)
    WHERE request_id <> '';
CREATE INDEX approver_approvals_pending ON approver_approvals (created_unix_ms) WHERE state = 0;
CREATE INDEX approver_approvals_answered ON approver_approvals (answered_unix_ms, id)
    WHERE state <> 0;
