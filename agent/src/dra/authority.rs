//! The kubelet's plugin watcher dials a registration socket with the socket's path as the target,
//! so grpc-go sends that path as the HTTP/2 `:authority`; the `h2` server under tonic refuses it
//! as malformed (`RST_STREAM` with `PROTOCOL_ERROR`, the kubelet then logs `failed to get plugin
//! info using RPC GetInfo`; kubernetes/kubernetes#109081). Every connection to a registration
//! socket therefore passes through [`relay`]: it replaces the value of each `:authority` field of
//! the client's header blocks by `localhost`, keeping the field's representation, so that the
//! HPACK dynamic tables of both ends keep the same entries in the same places; everything else
//! passes unchanged.

use tokio::io::{AsyncRead, AsyncReadExt as _, AsyncWrite, AsyncWriteExt as _};

/// The client's connection preface.
const PREFACE_LEN: usize = 24;
/// Frame types and flags (RFC 9113).
const HEADERS: u8 = 0x1;
const END_HEADERS: u8 = 0x4;
const PADDED: u8 = 0x8;
const PRIORITY: u8 = 0x20;
/// `:authority`'s index in HPACK's static table.
const AUTHORITY: usize = 1;
/// The value put in its place.
const LOCALHOST: &[u8] = b"localhost";

/// Reads an HPACK integer with an `n`-bit prefix at `at` (RFC 7541, 5.1).
fn int(buf: &[u8], at: &mut usize, n: u32) -> Option<usize> {
    let max = (1usize << n) - 1;
    let mut value = usize::from(*buf.get(*at)?) & max;
    *at += 1;
    if value < max {
        return Some(value);
    }
    for shift in (0..28).step_by(7) {
        let b = *buf.get(*at)?;
        *at += 1;
        value += usize::from(b & 0x7f) << shift;
        if b & 0x80 == 0 {
            return Some(value);
        }
    }
    None
}

/// Writes `value` as an HPACK integer with an `n`-bit prefix after the bits `pattern`.
fn put_int(out: &mut Vec<u8>, pattern: u8, n: u32, mut value: usize) {
    let max = (1usize << n) - 1;
    if value < max {
        out.push(pattern | value as u8);
        return;
    }
    out.push(pattern | max as u8);
    value -= max;
    while value >= 0x80 {
        out.push((value & 0x7f) as u8 | 0x80);
        value >>= 7;
    }
    out.push(value as u8);
}

/// Skips a string literal at `at`: whether it is Huffman-coded, and its bytes.
fn string<'a>(buf: &'a [u8], at: &mut usize) -> Option<(bool, &'a [u8])> {
    let huffman = buf.get(*at)? & 0x80 != 0;
    let len = int(buf, at, 7)?;
    let bytes = buf.get(*at..at.checked_add(len)?)?;
    *at += len;
    Some((huffman, bytes))
}

/// A header block with each `:authority` value replaced by `localhost`; `None` when the block
/// cannot be parsed (it is then passed on as it is).
pub fn rewrite_block(block: &[u8]) -> Option<Vec<u8>> {
    let mut out = Vec::with_capacity(block.len());
    let mut at = 0;
    while at < block.len() {
        let start = at;
        let first = block[at];
        // (prefix bits, the representation's pattern): literal with incremental indexing, else
        // without indexing or never indexed; an indexed field or a table size update is copied
        let (n, pattern) = match first {
            b if b & 0x80 != 0 => {
                int(block, &mut at, 7)?;
                out.extend_from_slice(&block[start..at]);
                continue;
            }
            b if b & 0xc0 == 0x40 => (6, 0x40),
            b if b & 0xe0 == 0x20 => {
                int(block, &mut at, 5)?;
                out.extend_from_slice(&block[start..at]);
                continue;
            }
            b => (4, b & 0xf0),
        };
        let name = int(block, &mut at, n)?;
        let authority = match name {
            0 => string(block, &mut at)? == (false, b":authority".as_slice()),
            i => i == AUTHORITY,
        };
        string(block, &mut at)?;
        if authority {
            put_int(&mut out, pattern, n, AUTHORITY);
            put_int(&mut out, 0, 7, LOCALHOST.len());
            out.extend_from_slice(LOCALHOST);
        } else {
            out.extend_from_slice(&block[start..at]);
        }
    }
    Some(out)
}

/// A HEADERS frame's payload with its block rewritten (and its padding dropped), and its new
/// flags; `None` when it cannot be parsed.
fn rewrite_headers(flags: u8, payload: &[u8]) -> Option<(u8, Vec<u8>)> {
    let (pad, start) = if flags & PADDED != 0 {
        (usize::from(*payload.first()?), 1)
    } else {
        (0, 0)
    };
    let block_start = start + if flags & PRIORITY != 0 { 5 } else { 0 };
    let block = payload.get(block_start..payload.len().checked_sub(pad)?)?;
    let mut out = payload.get(start..block_start)?.to_vec();
    out.extend(rewrite_block(block)?);
    Some((flags & !PADDED, out))
}

/// Copies the client's bytes to the server with the `:authority` of every complete header block
/// rewritten, until either side closes.
pub async fn rewrite<R, W>(mut client: R, mut server: W) -> std::io::Result<()>
where
    R: AsyncRead + Unpin,
    W: AsyncWrite + Unpin,
{
    let mut preface = [0u8; PREFACE_LEN];
    client.read_exact(&mut preface).await?;
    server.write_all(&preface).await?;
    loop {
        let mut head = [0u8; 9];
        client.read_exact(&mut head).await?;
        let len = usize::from(head[0]) << 16 | usize::from(head[1]) << 8 | usize::from(head[2]);
        let mut payload = vec![0u8; len];
        client.read_exact(&mut payload).await?;
        let (kind, flags) = (head[3], head[4]);
        if kind == HEADERS
            && flags & END_HEADERS != 0
            && let Some((flags, new)) = rewrite_headers(flags, &payload)
        {
            let n = new.len();
            head[..3].copy_from_slice(&[(n >> 16) as u8, (n >> 8) as u8, n as u8]);
            head[4] = flags;
            payload = new;
        }
        server.write_all(&head).await?;
        server.write_all(&payload).await?;
    }
}

/// Relays one connection of the registration socket to `server` (one end of a stream tonic
/// serves): the client's bytes through [`rewrite`], the server's unchanged.
pub async fn relay<S>(client: tokio::net::UnixStream, server: S)
where
    S: AsyncRead + AsyncWrite + Unpin,
{
    let (client_read, mut client_write) = client.into_split();
    let (mut server_read, server_write) = tokio::io::split(server);
    tokio::select! {
        _ = rewrite(client_read, server_write) => {}
        _ = tokio::io::copy(&mut server_read, &mut client_write) => {}
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// `:method POST` (indexed), `:authority` literal with incremental indexing (static name,
    /// plain value), `:path` literal without indexing, `:authority` with a literal name, a table
    /// size update, and an `:authority` value longer than 127 bytes (a multi-byte length).
    #[test]
    fn every_authority_value_becomes_localhost_and_the_rest_stays() {
        let path = b"/var/lib/kubelet/plugins_registry/gpu.nvidia.com-reg.sock";
        let long = vec![b'/'; 200];
        let mut block = vec![0x83, 0x41];
        put_int(&mut block, 0, 7, path.len());
        block.extend_from_slice(path);
        block.extend_from_slice(&[0x04, 5]);
        block.extend_from_slice(b"/a/Bc");
        block.extend_from_slice(&[0x40, 10]);
        block.extend_from_slice(b":authority");
        block.push(3);
        block.extend_from_slice(b"a/b");
        // a table size update of 4096; accept-charset (15) without indexing; :authority never
        // indexed, with a two-byte length
        block.extend_from_slice(&[0x3f, 0xe1, 0x1f]);
        block.extend_from_slice(&[0x0f, 0x00, 1, b'x']);
        block.push(0x11);
        put_int(&mut block, 0, 7, long.len());
        block.extend_from_slice(&long);
        let out = rewrite_block(&block).unwrap();
        let mut want = vec![0x83, 0x41, 9];
        want.extend_from_slice(b"localhost");
        want.extend_from_slice(&[0x04, 5]);
        want.extend_from_slice(b"/a/Bc");
        want.extend_from_slice(&[0x41, 9]);
        want.extend_from_slice(b"localhost");
        want.extend_from_slice(&[0x3f, 0xe1, 0x1f]);
        want.extend_from_slice(&[0x0f, 0x00, 1, b'x']);
        want.extend_from_slice(&[0x11, 9]);
        want.extend_from_slice(b"localhost");
        assert_eq!(out, want);
        // A truncated block is refused, not guessed at.
        assert_eq!(rewrite_block(&block[..block.len() - 3]), None);
    }

    #[test]
    fn integers_round_trip_across_their_prefix() {
        for (n, v) in [
            (7, 0),
            (7, 126),
            (7, 127),
            (7, 300),
            (5, 31),
            (4, 1000),
            (6, 70000),
        ] {
            let mut out = Vec::new();
            put_int(&mut out, 0, n, v);
            let mut at = 0;
            assert_eq!(int(&out, &mut at, n), Some(v), "{n} {v}");
            assert_eq!(at, out.len());
        }
    }

    #[tokio::test]
    async fn frames_pass_with_their_lengths_and_padding_fixed() {
        let mut input = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n".to_vec();
        // SETTINGS (empty), then a padded HEADERS frame with priority
        input.extend_from_slice(&[0, 0, 0, 0x4, 0, 0, 0, 0, 0]);
        let mut block = vec![0x41, 5];
        block.extend_from_slice(b"/x/yz");
        let mut payload = vec![2, 0, 0, 0, 0, 16];
        payload.extend_from_slice(&block);
        payload.extend_from_slice(&[0, 0]);
        let n = payload.len();
        input.extend_from_slice(&[
            0,
            0,
            n as u8,
            HEADERS,
            END_HEADERS | PADDED | PRIORITY,
            0,
            0,
            0,
            1,
        ]);
        input.extend_from_slice(&payload);
        let mut out = Vec::new();
        let e = rewrite(input.as_slice(), &mut out).await.unwrap_err();
        assert_eq!(e.kind(), std::io::ErrorKind::UnexpectedEof);
        let mut want = input[..PREFACE_LEN + 9].to_vec();
        let mut body = vec![0, 0, 0, 0, 16, 0x41, 9];
        body.extend_from_slice(b"localhost");
        want.extend_from_slice(&[
            0,
            0,
            body.len() as u8,
            HEADERS,
            END_HEADERS | PRIORITY,
            0,
            0,
            0,
            1,
        ]);
        want.extend_from_slice(&body);
        assert_eq!(out, want);
    }
}
