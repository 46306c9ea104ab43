//! LISTEN/NOTIFY across replicas: one dedicated connection per daemon listening on its
//! channels, reconnecting by itself when the database goes away. A consumer is told
//! [`Note::Resync`] after every (re)connection: notifications sent while it was not listening
//! are lost, so it reads the state it cares about again.

use std::time::Duration;

use futures::StreamExt;
use tokio::sync::broadcast;

use crate::pool::Pg;

/// What a listener hands its consumers.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Note {
    /// `NOTIFY channel, 'payload'` from any replica (this one included).
    Notify { channel: String, payload: String },
    /// Listening (again): anything may have changed meanwhile.
    Resync,
}

/// A running listener; stops when dropped.
pub struct Listener {
    tx: broadcast::Sender<Note>,
    task: tokio::task::JoinHandle<()>,
}

impl Drop for Listener {
    fn drop(&mut self) {
        self.task.abort();
    }
}

impl Listener {
    /// Starts listening on `channels` (plain identifiers, fixed by the daemon's code).
    pub fn spawn(pg: Pg, channels: &[&'static str]) -> Self {
        let (tx, _) = broadcast::channel(1024);
        let task = tokio::spawn(run(pg, channels.to_vec(), tx.clone()));
        Listener { tx, task }
    }

    pub fn subscribe(&self) -> broadcast::Receiver<Note> {
        self.tx.subscribe()
    }
}

async fn run(pg: Pg, channels: Vec<&'static str>, tx: broadcast::Sender<Note>) {
    let listen: String = channels.iter().map(|c| format!("LISTEN {c};")).collect();
    let mut backoff = Duration::from_millis(100);
    loop {
        match pg.dedicated().await {
            Ok((client, mut messages)) => {
                // The connection is driven by polling its messages; the LISTEN runs meanwhile.
                let (ready_tx, ready_rx) = tokio::sync::oneshot::channel::<()>();
                let listening = async {
                    client.batch_execute(&listen).await?;
                    let _ = ready_tx.send(());
                    // Keep the client alive as long as the connection is read.
                    std::future::pending::<Result<(), tokio_postgres::Error>>().await
                };
                let reading = async {
                    while let Some(m) = messages.next().await {
                        // Notices (the server's warnings) are not ours to act on.
                        if let tokio_postgres::AsyncMessage::Notification(n) = m? {
                            let _ = tx.send(Note::Notify {
                                channel: n.channel().to_string(),
                                payload: n.payload().to_string(),
                            });
                        }
                    }
                    Ok::<(), tokio_postgres::Error>(())
                };
                let announce = async {
                    // After LISTEN took effect: what changed before it is read again.
                    if ready_rx.await.is_ok() {
                        let _ = tx.send(Note::Resync);
                    }
                    std::future::pending::<()>().await
                };
                let why = tokio::select! {
                    r = listening => r.err().map(|e| e.to_string()),
                    r = reading => r.err().map(|e| e.to_string()),
                    _ = announce => None,
                };
                tracing::warn!(target = %pg.target(), error = ?why, "notification connection lost; reconnecting");
                backoff = Duration::from_millis(100);
            }
            Err(e) => {
                tracing::warn!(target = %pg.target(), error = %e, "cannot listen for notifications; retrying");
            }
        }
        tokio::time::sleep(backoff).await;
        backoff = (backoff * 2).min(Duration::from_secs(2));
    }
}
