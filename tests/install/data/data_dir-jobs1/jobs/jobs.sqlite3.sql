PRAGMA user_version=1;
BEGIN TRANSACTION;
CREATE TABLE inputs (
    job_id      TEXT NOT NULL REFERENCES jobs(id) ON DELETE CASCADE,
    idx         INTEGER NOT NULL,
    text        TEXT NOT NULL,
    state       TEXT NOT NULL DEFAULT 'pending' CHECK (state IN
                    ('pending','leased','done','failed','cancelled')),
    attempts    INTEGER NOT NULL DEFAULT 0,
    lease_token TEXT,
    not_before  REAL NOT NULL DEFAULT 0,
    last_error  TEXT,
    PRIMARY KEY (job_id, idx),
    CHECK ((state = 'leased') = (lease_token IS NOT NULL))
) WITHOUT ROWID;
INSERT INTO "inputs" VALUES('job_cancelled',0,'never','cancelled',0,NULL,0.0,NULL);
INSERT INTO "inputs" VALUES('job_done',0,'a cat','done',1,NULL,0.0,NULL);
INSERT INTO "inputs" VALUES('job_done',1,'a kitten','done',1,NULL,0.0,NULL);
INSERT INTO "inputs" VALUES('job_half',0,'one','done',1,NULL,0.0,NULL);
INSERT INTO "inputs" VALUES('job_half',1,'two','done',1,NULL,0.0,NULL);
INSERT INTO "inputs" VALUES('job_half',2,'three','leased',1,'101b6728f0638ce4',0.0,NULL);
INSERT INTO "inputs" VALUES('job_half',3,'four','pending',0,NULL,0.0,NULL);
CREATE TABLE jobs (
    seq          INTEGER PRIMARY KEY AUTOINCREMENT,
    id           TEXT NOT NULL UNIQUE,
    model        TEXT NOT NULL,
    status       TEXT NOT NULL CHECK (status IN
                     ('queued','running','paused','completed','cancelled','failed')),
    created_at   REAL NOT NULL,
    started_at   REAL,
    finished_at  REAL,
    max_attempts INTEGER NOT NULL CHECK (max_attempts >= 1),
    metadata     TEXT NOT NULL DEFAULT '{}',
    error        TEXT,
    total        INTEGER NOT NULL CHECK (total >= 1),
    n_pending    INTEGER NOT NULL,
    n_leased     INTEGER NOT NULL DEFAULT 0,
    n_done       INTEGER NOT NULL DEFAULT 0,
    n_failed     INTEGER NOT NULL DEFAULT 0,
    n_cancelled  INTEGER NOT NULL DEFAULT 0,
    CHECK (n_pending + n_leased + n_done + n_failed + n_cancelled = total)
);
INSERT INTO "jobs" VALUES(1,'job_done','embeddings','completed',1780000001.0,1780000002.0,1780000003.0,5,'{"source": "notes"}',NULL,2,0,0,2,0,0);
INSERT INTO "jobs" VALUES(2,'job_half','embeddings','running',1780000004.0,1780000005.0,NULL,5,'{}',NULL,4,1,1,2,0,0);
INSERT INTO "jobs" VALUES(3,'job_cancelled','embeddings','cancelled',1780000008.0,NULL,1780000009.0,5,'{}',NULL,1,0,0,0,0,1);
CREATE TABLE results (
    job_id       TEXT NOT NULL,
    idx          INTEGER NOT NULL,
    result       TEXT NOT NULL,
    completed_at REAL NOT NULL,
    PRIMARY KEY (job_id, idx),
    FOREIGN KEY (job_id, idx) REFERENCES inputs (job_id, idx) ON DELETE CASCADE
) WITHOUT ROWID;
INSERT INTO "results" VALUES('job_done',0,'{"embedding":[0.5,0.25]}',1780000003.0);
INSERT INTO "results" VALUES('job_done',1,'{"embedding":[0.5,0.5]}',1780000003.0);
INSERT INTO "results" VALUES('job_half',0,'{"embedding":[0.0]}',1780000006.0);
INSERT INTO "results" VALUES('job_half',1,'{"embedding":[1.0]}',1780000006.0);
CREATE INDEX inputs_by_state ON inputs (job_id, state, idx);
DELETE FROM "sqlite_sequence";
INSERT INTO "sqlite_sequence" VALUES('jobs',3);
COMMIT;
