-- Answers to a task's question given on a gateway replica that does not follow the task: held
-- here until its follower delivers them (`outcome`: NULL until then, then the JSON result).
CREATE TABLE gateway_answers (
    id        TEXT  PRIMARY KEY,
    task_id   TEXT  NOT NULL REFERENCES gateway_tasks (id) ON DELETE CASCADE,
    request   BYTEA NOT NULL,
    outcome   BYTEA
);
CREATE INDEX gateway_answers_open ON gateway_answers (task_id) WHERE outcome IS NULL;
