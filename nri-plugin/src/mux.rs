//! The NRI connection multiplexer (containerd/nri `pkg/net/multiplex`).
//!
//! One stream (the trunk) carries frames `[u32 BE conn id][u32 BE length][payload]`. Each
//! logical connection is a plain byte stream; there are no open, close or acknowledge frames.
//! Connection 1 carries the Plugin service, connection 2 the Runtime service.
//!
//! Frames written here carry at most [`MAX_SEND_FRAME`] bytes including the header, because the
//! Go runtime reads each frame into a 4096-byte buffer (docs/nri.md). Inbound frames may carry
//! up to [`MAX_RECV_PAYLOAD`] bytes and may be split anywhere by the transport.

use std::{io, sync::Arc};

use tokio::{
    io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt, DuplexStream, ReadHalf, WriteHalf},
    sync::Mutex,
    task::JoinHandle,
};

/// Length of a frame header.
pub const HEADER_LEN: usize = 8;
/// Largest frame (header included) this multiplexer writes.
pub const MAX_SEND_FRAME: usize = 4096;
/// Largest inbound payload accepted: a ttrpc header plus a 4 MiB ttrpc message.
pub const MAX_RECV_PAYLOAD: usize = 10 + 4 * 1024 * 1024;
/// Logical connection of the Plugin service (the runtime is the ttrpc client).
pub const PLUGIN_CONN: u32 = 1;
/// Logical connection of the Runtime service (the plugin is the ttrpc client).
pub const RUNTIME_CONN: u32 = 2;

/// Buffer between the trunk tasks and each logical connection.
const CONN_BUFFER: usize = 256 * 1024;
/// Payload bytes moved per read while forwarding an inbound frame.
const FORWARD_CHUNK: usize = 64 * 1024;

/// Errors that end a trunk.
#[derive(Debug, thiserror::Error)]
pub enum MuxError {
    /// Reading or writing the trunk failed.
    #[error("nri trunk i/o failed: {0}")]
    Io(#[from] io::Error),
    /// A frame header announced more payload than the protocol allows.
    #[error("nri frame for connection {conn} announces {len} bytes, more than the {max} allowed")]
    Oversized {
        /// Connection id of the frame.
        conn: u32,
        /// Announced payload length.
        len: usize,
        /// Largest length accepted.
        max: usize,
    },
    /// A frame named the reserved connection id 0.
    #[error("nri frame for reserved connection id 0")]
    ReservedConn,
    /// The trunk ended inside a frame.
    #[error("nri trunk closed inside a frame")]
    Truncated,
}

/// Parsed frame header.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct FrameHeader {
    /// Logical connection id.
    pub conn: u32,
    /// Payload length.
    pub len: usize,
}

impl FrameHeader {
    /// Decodes and validates a header against [`MAX_RECV_PAYLOAD`].
    pub fn decode(bytes: [u8; HEADER_LEN]) -> Result<Self, MuxError> {
        let [c0, c1, c2, c3, l0, l1, l2, l3] = bytes;
        let conn = u32::from_be_bytes([c0, c1, c2, c3]);
        let len = u32::from_be_bytes([l0, l1, l2, l3]) as usize;
        if conn == 0 {
            return Err(MuxError::ReservedConn);
        }
        if len > MAX_RECV_PAYLOAD {
            return Err(MuxError::Oversized {
                conn,
                len,
                max: MAX_RECV_PAYLOAD,
            });
        }
        Ok(Self { conn, len })
    }

    /// Encodes the header.
    pub fn encode(self) -> [u8; HEADER_LEN] {
        let mut out = [0u8; HEADER_LEN];
        let len = u32::try_from(self.len).unwrap_or(u32::MAX);
        out[..4].copy_from_slice(&self.conn.to_be_bytes());
        out[4..].copy_from_slice(&len.to_be_bytes());
        out
    }
}

/// A running multiplexer over one trunk, exposing connections 1 and 2 as byte streams.
///
/// Dropping it stops its tasks and closes the trunk.
#[derive(Debug)]
pub struct Trunk {
    reader: JoinHandle<Result<(), MuxError>>,
    reader_done: bool,
    writers: [JoinHandle<()>; 2],
}

/// The logical connections of a [`Trunk`].
#[derive(Debug)]
pub struct Conns {
    /// Connection 1, the Plugin service.
    pub plugin: DuplexStream,
    /// Connection 2, the Runtime service.
    pub runtime: DuplexStream,
}

impl Trunk {
    /// Starts demultiplexing `stream` (needs a tokio runtime).
    pub fn start<S>(stream: S) -> (Self, Conns)
    where
        S: AsyncRead + AsyncWrite + Send + 'static,
    {
        let (read_half, write_half) = tokio::io::split(stream);
        let write_half = Arc::new(Mutex::new(write_half));
        let (plugin, plugin_inner) = tokio::io::duplex(CONN_BUFFER);
        let (runtime, runtime_inner) = tokio::io::duplex(CONN_BUFFER);
        let (plugin_rx, plugin_tx) = tokio::io::split(plugin_inner);
        let (runtime_rx, runtime_tx) = tokio::io::split(runtime_inner);
        let writers = [
            tokio::spawn(write_conn(PLUGIN_CONN, plugin_rx, Arc::clone(&write_half))),
            tokio::spawn(write_conn(RUNTIME_CONN, runtime_rx, write_half)),
        ];
        let reader = tokio::spawn(read_trunk(read_half, plugin_tx, runtime_tx));
        let trunk = Self {
            reader,
            reader_done: false,
            writers,
        };
        (trunk, Conns { plugin, runtime })
    }

    /// Waits until the trunk's inbound side ends: `Ok` on a clean end of stream between frames
    /// (and on every call after the first that returned). Cancel-safe.
    pub async fn closed(&mut self) -> Result<(), MuxError> {
        if self.reader_done {
            return Ok(());
        }
        let joined = (&mut self.reader).await;
        self.reader_done = true;
        match joined {
            Ok(result) => result,
            Err(join) => Err(MuxError::Io(io::Error::other(join))),
        }
    }
}

impl Drop for Trunk {
    fn drop(&mut self) {
        self.reader.abort();
        for writer in &self.writers {
            writer.abort();
        }
    }
}

/// Moves bytes written to one logical connection onto the trunk as frames.
async fn write_conn<S: AsyncWrite>(
    conn: u32,
    mut source: ReadHalf<DuplexStream>,
    trunk: Arc<Mutex<WriteHalf<S>>>,
) {
    let mut frame = vec![0u8; MAX_SEND_FRAME];
    loop {
        let n = match source.read(&mut frame[HEADER_LEN..]).await {
            Ok(0) | Err(_) => return,
            Ok(n) => n,
        };
        frame[..HEADER_LEN].copy_from_slice(&FrameHeader { conn, len: n }.encode());
        let mut trunk = trunk.lock().await;
        let written = trunk.write_all(&frame[..HEADER_LEN + n]).await;
        if written.and(trunk.flush().await).is_err() {
            return;
        }
    }
}

/// Reads frames from the trunk and forwards each payload to its logical connection; when the
/// trunk ends, both logical connections see end of stream.
async fn read_trunk<S: AsyncRead>(
    mut trunk: ReadHalf<S>,
    mut plugin: WriteHalf<DuplexStream>,
    mut runtime: WriteHalf<DuplexStream>,
) -> Result<(), MuxError> {
    let result = demux(&mut trunk, &mut plugin, &mut runtime).await;
    // Shutting down (not just dropping) the write halves is what signals EOF to the readers.
    let _ = plugin.shutdown().await;
    let _ = runtime.shutdown().await;
    result
}

async fn demux<S: AsyncRead>(
    trunk: &mut ReadHalf<S>,
    plugin: &mut WriteHalf<DuplexStream>,
    runtime: &mut WriteHalf<DuplexStream>,
) -> Result<(), MuxError> {
    let mut chunk = vec![0u8; FORWARD_CHUNK];
    loop {
        let mut header = [0u8; HEADER_LEN];
        match read_full(trunk, &mut header).await? {
            0 => return Ok(()),
            HEADER_LEN => {}
            _ => return Err(MuxError::Truncated),
        }
        let header = FrameHeader::decode(header)?;
        let mut target = match header.conn {
            PLUGIN_CONN => Some(&mut *plugin),
            RUNTIME_CONN => Some(&mut *runtime),
            other => {
                tracing::debug!(
                    conn = other,
                    len = header.len,
                    "dropping frame for unknown connection"
                );
                None
            }
        };
        let mut left = header.len;
        while left > 0 {
            let want = left.min(chunk.len());
            let buf = &mut chunk[..want];
            if read_full(trunk, buf).await? != want {
                return Err(MuxError::Truncated);
            }
            left -= want;
            // A logical connection whose user went away only loses its own data.
            if let Some(conn) = target.as_mut()
                && conn.write_all(buf).await.is_err()
            {
                target = None;
            }
        }
    }
}

/// Fills `buf` unless the stream ends first; returns the number of bytes read.
async fn read_full<R: AsyncRead + Unpin>(reader: &mut R, buf: &mut [u8]) -> io::Result<usize> {
    let mut filled = 0;
    while filled < buf.len() {
        match reader.read(&mut buf[filled..]).await? {
            0 => break,
            n => filled += n,
        }
    }
    Ok(filled)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn header_round_trips_and_rejects_bad_values() {
        let header = FrameHeader { conn: 2, len: 4086 };
        assert_eq!(FrameHeader::decode(header.encode()).unwrap(), header);
        assert!(matches!(
            FrameHeader::decode(FrameHeader { conn: 0, len: 1 }.encode()),
            Err(MuxError::ReservedConn)
        ));
        let big = FrameHeader {
            conn: 1,
            len: MAX_RECV_PAYLOAD + 1,
        };
        assert!(matches!(
            FrameHeader::decode(big.encode()),
            Err(MuxError::Oversized { .. })
        ));
    }

    #[tokio::test]
    async fn closed_can_be_awaited_again() {
        let (ours, theirs) = tokio::io::duplex(64);
        let (mut trunk, _conns) = Trunk::start(ours);
        drop(theirs);
        let wait = std::time::Duration::from_secs(5);
        tokio::time::timeout(wait, trunk.closed())
            .await
            .unwrap()
            .unwrap();
        tokio::time::timeout(wait, trunk.closed())
            .await
            .unwrap()
            .unwrap();
    }
}
