//! Property tests of the multiplexer and of the plugin under hostile input: any fragmentation
//! decodes to the same bytes, every outbound frame fits 4096 bytes, and malformed frames,
//! truncated protobuf and oversized lengths end the connection without panic or hang.

use std::{
    collections::VecDeque,
    io,
    pin::Pin,
    sync::{Arc, Mutex},
    task::{Context, Poll},
    time::Duration,
};

use mockgpu_nri::{
    Config, GpuInventory, Inventory, NotReady, Plugin,
    mux::{FrameHeader, MAX_RECV_PAYLOAD, MAX_SEND_FRAME, MuxError, Trunk},
};
use proptest::prelude::*;
use tokio::{
    io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt, ReadBuf},
    time::timeout,
};

const WAIT: Duration = Duration::from_secs(10);

/// A trunk that yields scripted read chunks (then EOF) and records everything written.
struct Scripted {
    chunks: VecDeque<Vec<u8>>,
    written: Arc<Mutex<Vec<u8>>>,
}

impl AsyncRead for Scripted {
    fn poll_read(
        mut self: Pin<&mut Self>,
        _: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        if let Some(mut chunk) = self.chunks.pop_front() {
            let n = chunk.len().min(buf.remaining());
            buf.put_slice(&chunk[..n]);
            if n < chunk.len() {
                self.chunks.push_front(chunk.split_off(n));
            }
        }
        Poll::Ready(Ok(()))
    }
}

impl AsyncWrite for Scripted {
    fn poll_write(
        self: Pin<&mut Self>,
        _: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        self.written.lock().unwrap().extend_from_slice(buf);
        Poll::Ready(Ok(buf.len()))
    }
    fn poll_flush(self: Pin<&mut Self>, _: &mut Context<'_>) -> Poll<io::Result<()>> {
        Poll::Ready(Ok(()))
    }
    fn poll_shutdown(self: Pin<&mut Self>, _: &mut Context<'_>) -> Poll<io::Result<()>> {
        Poll::Ready(Ok(()))
    }
}

fn runtime() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap()
}

fn frame(conn: u32, payload: &[u8]) -> Vec<u8> {
    let mut out = FrameHeader {
        conn,
        len: payload.len(),
    }
    .encode()
    .to_vec();
    out.extend_from_slice(payload);
    out
}

/// Splits `bytes` at the given (sorted, deduplicated) cut points.
fn fragment(bytes: &[u8], cuts: &[usize]) -> VecDeque<Vec<u8>> {
    let mut points: Vec<usize> = cuts.iter().map(|c| c % (bytes.len() + 1)).collect();
    points.sort_unstable();
    points.dedup();
    let mut out = VecDeque::new();
    let mut start = 0;
    for p in points.into_iter().chain([bytes.len()]) {
        if p > start {
            out.push_back(bytes[start..p].to_vec());
            start = p;
        }
    }
    out
}

/// Feeds `chunks` through a trunk; returns what each connection received and how it ended.
async fn demux(chunks: VecDeque<Vec<u8>>) -> (Vec<u8>, Vec<u8>, Result<(), MuxError>) {
    let (mut trunk, mut conns) = Trunk::start(Scripted {
        chunks,
        written: Arc::default(),
    });
    let (mut one, mut two) = (Vec::new(), Vec::new());
    let (r1, r2, closed) = tokio::join!(
        conns.plugin.read_to_end(&mut one),
        conns.runtime.read_to_end(&mut two),
        trunk.closed()
    );
    r1.unwrap();
    r2.unwrap();
    (one, two, closed)
}

/// [`demux`] on its own runtime, bounded by [`WAIT`].
fn demux_now(chunks: VecDeque<Vec<u8>>) -> (Vec<u8>, Vec<u8>, Result<(), MuxError>) {
    runtime()
        .block_on(async { timeout(WAIT, demux(chunks)).await })
        .expect("demux hung")
}

/// Splits a frame stream the way [`Trunk`] writes it into (conn, payload) pairs.
fn parse_frames(mut bytes: &[u8]) -> Vec<(u32, Vec<u8>)> {
    let mut frames = Vec::new();
    while !bytes.is_empty() {
        let header = FrameHeader::decode(bytes[..8].try_into().unwrap()).unwrap();
        frames.push((header.conn, bytes[8..8 + header.len].to_vec()));
        bytes = &bytes[8 + header.len..];
    }
    frames
}

struct NoGpus;

impl Inventory for NoGpus {
    fn snapshot(&self) -> Result<GpuInventory, NotReady> {
        Err(NotReady("test".into()))
    }
}

/// A ttrpc request message (10-byte header + `grpc.Request` protobuf) with a chosen payload.
fn ttrpc_request(
    stream_id: u32,
    method: &str,
    payload: &[u8],
    truncate_to: Option<usize>,
) -> Vec<u8> {
    let mut req = ttrpc::Request::new();
    req.service = "nri.pkg.api.v1alpha1.Plugin".into();
    req.method = method.into();
    req.payload = payload.to_vec();
    req.timeout_nano = 2_000_000_000;
    let mut body = protobuf::Message::write_to_bytes(&req).unwrap();
    if let Some(n) = truncate_to {
        body.truncate(n);
    }
    let mut out = (body.len() as u32).to_be_bytes().to_vec();
    out.extend_from_slice(&stream_id.to_be_bytes());
    out.extend_from_slice(&[1, 0]);
    out.extend_from_slice(&body);
    out
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(64))]

    #[test]
    fn any_fragmentation_decodes_to_the_same_streams(
        frames in prop::collection::vec((1u32..=3, prop::collection::vec(any::<u8>(), 0..9000)), 0..12),
        cuts in prop::collection::vec(any::<usize>(), 0..40),
    ) {
        let mut wire = Vec::new();
        let (mut want1, mut want2) = (Vec::new(), Vec::new());
        for (conn, payload) in &frames {
            wire.extend(frame(*conn, payload));
            match conn {
                1 => want1.extend_from_slice(payload),
                2 => want2.extend_from_slice(payload),
                _ => {} // unknown connections are dropped, as in Go
            }
        }
        let (one, two, closed) = demux_now(fragment(&wire, &cuts));
        prop_assert!(closed.is_ok(), "{closed:?}");
        prop_assert_eq!(one, want1);
        prop_assert_eq!(two, want2);
    }

    #[test]
    fn outbound_frames_fit_and_reassemble(writes in prop::collection::vec((any::<bool>(), prop::collection::vec(any::<u8>(), 1..20000)), 1..8)) {
        let written = Arc::new(Mutex::new(Vec::new()));
        let (want1, want2) = runtime().block_on(async {
            let (_trunk, mut conns) = Trunk::start(Scripted { chunks: VecDeque::new(), written: Arc::clone(&written) });
            let (mut want1, mut want2) = (Vec::new(), Vec::new());
            for (first, data) in &writes {
                let (conn, want) = if *first { (&mut conns.plugin, &mut want1) } else { (&mut conns.runtime, &mut want2) };
                timeout(WAIT, conn.write_all(data)).await.expect("write hung").unwrap();
                want.extend_from_slice(data);
            }
            let total = want1.len() + want2.len();
            timeout(WAIT, async {
                loop {
                    let bytes = written.lock().unwrap().clone();
                    let payload: usize = parse_frames(&bytes).iter().map(|(_, p)| p.len()).sum();
                    if payload == total {
                        break;
                    }
                    tokio::time::sleep(Duration::from_millis(1)).await;
                }
            }).await.expect("writer hung");
            (want1, want2)
        });
        let bytes = written.lock().unwrap().clone();
        let frames = parse_frames(&bytes);
        prop_assert!(frames.iter().all(|(_, p)| 8 + p.len() <= MAX_SEND_FRAME));
        let got1: Vec<u8> = frames.iter().filter(|(c, _)| *c == 1).flat_map(|(_, p)| p.clone()).collect();
        let got2: Vec<u8> = frames.iter().filter(|(c, _)| *c == 2).flat_map(|(_, p)| p.clone()).collect();
        prop_assert_eq!(got1, want1);
        prop_assert_eq!(got2, want2);
    }

    #[test]
    fn garbage_never_panics_or_hangs(garbage in prop::collection::vec(any::<u8>(), 0..5000), cuts in prop::collection::vec(any::<usize>(), 0..10)) {
        let ended = runtime().block_on(async { timeout(WAIT, demux(fragment(&garbage, &cuts))).await });
        prop_assert!(ended.is_ok(), "trunk hung on garbage");
    }

    #[test]
    fn hostile_frames_end_the_plugin_connection(
        frames in prop::collection::vec(
            prop_oneof![
                // Garbage on either connection, including unknown ones.
                (0u32..4, prop::collection::vec(any::<u8>(), 0..300)).prop_map(|(c, p)| frame(c, &p)),
                // A ttrpc request whose protobuf is truncated, or whose payload is garbage.
                (prop::collection::vec(any::<u8>(), 0..200), 0usize..60, any::<bool>()).prop_map(|(p, cut, trunc)| {
                    frame(1, &ttrpc_request(1, "CreateContainer", &p, trunc.then_some(cut)))
                }),
                // An oversized length.
                (MAX_RECV_PAYLOAD as u32 + 1..u32::MAX).prop_map(|len| {
                    let mut f = 1u32.to_be_bytes().to_vec();
                    f.extend_from_slice(&len.to_be_bytes());
                    f
                }),
            ],
            1..6,
        ),
        cut_tail in 0usize..8,
    ) {
        let mut wire: Vec<u8> = frames.concat();
        wire.truncate(wire.len().saturating_sub(cut_tail));
        let result = runtime().block_on(async {
            let (tx, _rx) = tokio::sync::mpsc::unbounded_channel();
            let plugin = Plugin::new(Config::default(), Arc::new(NoGpus), Arc::new(tx)).unwrap();
            let (ours, mut theirs) = tokio::io::duplex(1 << 16);
            let runtime_side = async move {
                theirs.write_all(&wire).await.unwrap();
                // Give the plugin time to answer what it can, then hang up.
                tokio::time::sleep(Duration::from_millis(20)).await;
                drop(theirs);
            };
            let (served, ()) = tokio::join!(
                timeout(WAIT, plugin.run_connection(ours, std::future::pending())),
                runtime_side,
            );
            served
        });
        prop_assert!(result.is_ok(), "plugin hung on hostile input");
    }
}

#[test]
fn oversized_and_truncated_frames_are_errors() {
    let mut big = 1u32.to_be_bytes().to_vec();
    big.extend_from_slice(&(MAX_RECV_PAYLOAD as u32 + 1).to_be_bytes());
    let (_, _, closed) = demux_now(VecDeque::from([big]));
    assert!(
        matches!(closed, Err(MuxError::Oversized { conn: 1, .. })),
        "{closed:?}"
    );
    let (_, _, closed) = demux_now(VecDeque::from([vec![0, 0, 0, 1, 0]]));
    assert!(matches!(closed, Err(MuxError::Truncated)), "{closed:?}");
    let (one, _, closed) = demux_now(VecDeque::from([frame(1, b"abcdef")[..10].to_vec()]));
    assert!(matches!(closed, Err(MuxError::Truncated)), "{closed:?}");
    assert!(one.len() <= 2);
    let (_, _, closed) = demux_now(VecDeque::from([frame(0, b"x")]));
    assert!(matches!(closed, Err(MuxError::ReservedConn)), "{closed:?}");
    // A maximal frame is accepted.
    let payload = vec![7u8; MAX_RECV_PAYLOAD];
    let (one, _, closed) = demux_now(VecDeque::from([frame(1, &payload)]));
    assert!(closed.is_ok());
    assert_eq!(one.len(), MAX_RECV_PAYLOAD);
}

/// Go's writer sends a large message as one frame; the plugin must take it whole (≤ 4 MiB + 10).
#[test]
fn a_large_request_in_a_single_frame_is_served() {
    use mockgpu_nri::proto::api::{
        Container, CreateContainerRequest, CreateContainerResponse, PodSandbox,
    };
    use protobuf::Message;

    runtime().block_on(async {
        let (tx, _rx) = tokio::sync::mpsc::unbounded_channel();
        let plugin = Plugin::new(Config::default(), Arc::new(NoGpus), Arc::new(tx)).unwrap();
        let (ours, mut theirs) = tokio::io::duplex(1 << 20);
        let serving =
            tokio::spawn(async move { plugin.run_connection(ours, std::future::pending()).await });
        let mut container = Container::new();
        container.name = "big".into();
        container.env = (0..2000)
            .map(|i| format!("VARIABLE_{i:05}=value-{i:020}"))
            .collect();
        let mut req = CreateContainerRequest::new();
        req.pod = Some(PodSandbox::new()).into();
        req.container = Some(container).into();
        let message = ttrpc_request(1, "CreateContainer", &req.write_to_bytes().unwrap(), None);
        assert!(message.len() > 60_000);
        timeout(WAIT, theirs.write_all(&frame(1, &message)))
            .await
            .unwrap()
            .unwrap();

        // Collect connection 1's bytes from the plugin's frames until one ttrpc response is whole.
        let response = timeout(WAIT, async {
            let mut conn1 = Vec::new();
            loop {
                let mut header = [0u8; 8];
                theirs.read_exact(&mut header).await.unwrap();
                let header = FrameHeader::decode(header).unwrap();
                assert!(8 + header.len <= MAX_SEND_FRAME);
                let mut payload = vec![0u8; header.len];
                theirs.read_exact(&mut payload).await.unwrap();
                if header.conn != 1 {
                    continue; // RegisterPlugin on connection 2
                }
                conn1.extend_from_slice(&payload);
                if conn1.len() >= 10 {
                    let len = u32::from_be_bytes(conn1[..4].try_into().unwrap()) as usize;
                    if conn1.len() >= 10 + len {
                        assert_eq!(conn1[8], 2, "not a response");
                        return ttrpc::Response::parse_from_bytes(&conn1[10..10 + len]).unwrap();
                    }
                }
            }
        })
        .await
        .expect("no response to a large request");
        assert!(
            response.status.is_none() || response.status.code() == ttrpc::Code::OK,
            "{response:?}"
        );
        assert_eq!(
            CreateContainerResponse::parse_from_bytes(&response.payload).unwrap(),
            CreateContainerResponse::new()
        );
        drop(theirs);
        timeout(WAIT, serving).await.unwrap().unwrap().unwrap();
    });
}
