-- warden-policy's audit log: one row per decision, committed before the decision is answered.
-- `record` is the prost-encoded warden.v1.AuditRecord (the same bytes the sled backend keeps);
-- the other columns are what the admin API filters and orders on.
CREATE TABLE policy_audit (
    seq                BIGSERIAL PRIMARY KEY,
    decision_id        TEXT   NOT NULL UNIQUE,
    request_id         TEXT   NOT NULL,
    context_id         TEXT   NOT NULL,
    decided_at_unix_ms BIGINT NOT NULL,
    record             BYTEA  NOT NULL
);
CREATE INDEX policy_audit_context ON policy_audit (context_id, seq);
