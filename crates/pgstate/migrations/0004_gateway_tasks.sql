-- warden-gateway's task store, shared by its replicas. Values are the same JSON bytes the sled backend
-- keeps (`services/gateway/src/store.rs`; BYTEA, not JSONB: an agent's text may hold a NUL, which
-- JSONB refuses); the other columns are what ListTasks, the sweep's
-- retention and `max_tasks`, and the live-task leases filter and order on.
CREATE TABLE gateway_tasks (
    id             TEXT    PRIMARY KEY,
    principal      TEXT    NOT NULL,
    context_id     TEXT    NOT NULL,
    terminal       BOOLEAN NOT NULL,
    status_micros  BIGINT  NOT NULL,
    -- The replica following the task's turn, and until when it is known to be alive (it renews
    -- the lease of every task it follows; a lease that ran out marks a task whose follower died).
    owner          TEXT    NOT NULL DEFAULT '',
    lease_micros   BIGINT  NOT NULL DEFAULT 0,
    head           BYTEA   NOT NULL
);
CREATE INDEX gateway_tasks_principal ON gateway_tasks (principal, status_micros DESC);
CREATE INDEX gateway_tasks_context ON gateway_tasks (context_id);
CREATE INDEX gateway_tasks_live ON gateway_tasks (lease_micros) WHERE NOT terminal;

-- One message, or a segment of consecutive ones (a JSON array) numbered from `seq` on.
CREATE TABLE gateway_history (
    task_id TEXT   NOT NULL REFERENCES gateway_tasks (id) ON DELETE CASCADE,
    seq     BIGINT NOT NULL,
    value   BYTEA  NOT NULL,
    PRIMARY KEY (task_id, seq)
);

CREATE TABLE gateway_artifacts (
    task_id   TEXT   NOT NULL REFERENCES gateway_tasks (id) ON DELETE CASCADE,
    idx       INT    NOT NULL,
    chunk     BIGINT NOT NULL,
    value     BYTEA  NOT NULL,
    PRIMARY KEY (task_id, idx, chunk)
);

CREATE TABLE gateway_push (
    task_id   TEXT NOT NULL REFERENCES gateway_tasks (id) ON DELETE CASCADE,
    config_id TEXT NOT NULL,
    value     BYTEA NOT NULL,
    PRIMARY KEY (task_id, config_id)
);

CREATE TABLE gateway_contexts (
    id        TEXT  PRIMARY KEY,
    principal TEXT  NOT NULL,
    value     BYTEA NOT NULL
);
