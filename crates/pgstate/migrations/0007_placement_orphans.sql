-- Who opened each placed conversation (a cell closes only what is this principal's), and the
-- conversations left on a lost cell when their context moved: closed there by a gateway once
-- that same start of the cell is live again (a partition healed), then forgotten; forgotten
-- unclosed when the cell restarted (its recovery removed them). 0006 as merged is left as it
-- was: a migration is never edited.
ALTER TABLE placement_contexts ADD COLUMN principal TEXT NOT NULL DEFAULT '';
CREATE TABLE placement_orphans (
    cell_id         TEXT   NOT NULL,
    cell_started_ms BIGINT NOT NULL,
    context_id      TEXT   NOT NULL,
    principal       TEXT   NOT NULL,
    PRIMARY KEY (cell_id, context_id)
);
