PRAGMA user_version=0;
BEGIN TRANSACTION;
CREATE TABLE events (
    id INTEGER PRIMARY KEY AUTOINCREMENT,
    camera TEXT NOT NULL,
    at REAL NOT NULL,
    frame INTEGER NOT NULL,
    video_s REAL NOT NULL,
    label TEXT NOT NULL,
    score REAL NOT NULL,
    box TEXT NOT NULL
);
INSERT INTO "events" VALUES(1,'porch',1780000100.0,0,0.0,'person',0.9,'[1, 2, 3, 4]');
INSERT INTO "events" VALUES(2,'porch',1780000101.0,1,0.5,'person',0.9,'[1, 2, 3, 4]');
INSERT INTO "events" VALUES(3,'porch',1780000102.0,2,1.0,'person',0.9,'[1, 2, 3, 4]');
CREATE INDEX events_camera ON events (camera, id);
DELETE FROM "sqlite_sequence";
INSERT INTO "sqlite_sequence" VALUES('events',3);
COMMIT;
