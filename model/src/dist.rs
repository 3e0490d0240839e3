//! The rendezvous of rank processes (`--dist-init HOST:PORT --rank R --world-size W`): rank 0
//! listens on the address and hands every other rank the bytes it was given (the collective
//! library's unique id), over plain TCP with a deadline, so the ranks of one communicator can
//! live in separate processes or on separate hosts.

use std::io::{Read, Write};
use std::net::{SocketAddr, TcpListener, TcpStream, ToSocketAddrs};
use std::time::{Duration, Instant};

use crate::error::ModelError;

/// Bytes a hello carries: a tag, the rank, the world size.
const HELLO: usize = 12;
/// Tag of a hello (`rfd1`), so that a stray connection is refused, not answered.
const TAG: [u8; 4] = *b"rfd1";

/// One process's place among the ranks.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct DistSpec {
    /// Where rank 0 listens (`HOST:PORT`).
    pub addr: String,
    /// This process's rank, `0..world`.
    pub rank: usize,
    /// Number of ranks.
    pub world: usize,
    /// How long the rendezvous waits for the other ranks.
    pub timeout: Duration,
}

impl DistSpec {
    /// The spec of `--dist-init`, `--rank` and `--world-size`, checked.
    pub fn new(
        addr: &str,
        rank: usize,
        world: usize,
        timeout: Duration,
    ) -> Result<Self, ModelError> {
        if world < 2 || rank >= world {
            return Err(ModelError::InvalidArgument(format!(
                "--rank {rank} --world-size {world}: needs at least 2 ranks and a rank below the world size"
            )));
        }
        Ok(Self {
            addr: addr.to_owned(),
            rank,
            world,
            timeout,
        })
    }

    fn err(&self, reason: impl Into<String>) -> ModelError {
        ModelError::Rendezvous {
            addr: self.addr.clone(),
            reason: reason.into(),
        }
    }

    fn resolve(&self) -> Result<SocketAddr, ModelError> {
        self.addr
            .to_socket_addrs()
            .map_err(|e| self.err(format!("cannot resolve: {e}")))?
            .next()
            .ok_or_else(|| self.err("resolves to no address"))
    }

    /// Rank 0: serves `payload` to each of the other ranks; returns it once all have it.
    /// Other ranks: fetch it from rank 0 (`payload` unused), retrying the connection until the
    /// deadline.
    pub fn exchange(&self, payload: &[u8], len: usize) -> Result<Vec<u8>, ModelError> {
        let deadline = Instant::now() + self.timeout;
        if self.rank == 0 {
            if payload.len() != len {
                return Err(self.err(format!("{} bytes to serve, {len} expected", payload.len())));
            }
            self.serve(payload, deadline)?;
            Ok(payload.to_vec())
        } else {
            self.fetch(len, deadline)
        }
    }

    fn serve(&self, payload: &[u8], deadline: Instant) -> Result<(), ModelError> {
        let listener = TcpListener::bind(self.resolve()?)
            .map_err(|e| self.err(format!("cannot listen: {e}")))?;
        listener
            .set_nonblocking(true)
            .map_err(|e| self.err(e.to_string()))?;
        let mut joined = vec![false; self.world];
        joined[0] = true;
        while joined.iter().any(|j| !j) {
            match listener.accept() {
                Ok((mut s, peer)) => {
                    // A bad hello (a port scanner, a rank of another run) is dropped, not fatal.
                    match self.answer(&mut s, payload, deadline) {
                        Ok(r) if !joined[r] => joined[r] = true,
                        Ok(r) => tracing::warn!("rendezvous {}: rank {r} joined twice", self.addr),
                        Err(e) => tracing::warn!("rendezvous {}: {peer}: {e}", self.addr),
                    }
                }
                Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => {
                    if Instant::now() >= deadline {
                        let missing: Vec<usize> = (0..self.world).filter(|&r| !joined[r]).collect();
                        return Err(self.err(format!(
                            "ranks {missing:?} did not join within {:?}",
                            self.timeout
                        )));
                    }
                    std::thread::sleep(Duration::from_millis(20));
                }
                Err(e) => return Err(self.err(format!("accept: {e}"))),
            }
        }
        Ok(())
    }

    /// Reads a hello from `s` and answers with `payload`; the rank that said hello.
    fn answer(
        &self,
        s: &mut TcpStream,
        payload: &[u8],
        deadline: Instant,
    ) -> Result<usize, String> {
        let left = deadline
            .saturating_duration_since(Instant::now())
            .max(Duration::from_millis(100));
        s.set_nonblocking(false).map_err(|e| e.to_string())?;
        s.set_read_timeout(Some(left)).map_err(|e| e.to_string())?;
        s.set_write_timeout(Some(left)).map_err(|e| e.to_string())?;
        let mut hello = [0u8; HELLO];
        s.read_exact(&mut hello)
            .map_err(|e| format!("hello: {e}"))?;
        let word =
            |i: usize| u32::from_le_bytes([hello[i], hello[i + 1], hello[i + 2], hello[i + 3]]);
        let (rank, world) = (word(4) as usize, word(8) as usize);
        if hello[..4] != TAG || world != self.world || rank == 0 || rank >= world {
            return Err(format!(
                "unexpected hello (rank {rank}, world size {world}; this run has {})",
                self.world
            ));
        }
        s.write_all(payload).map_err(|e| format!("answer: {e}"))?;
        Ok(rank)
    }

    fn fetch(&self, len: usize, deadline: Instant) -> Result<Vec<u8>, ModelError> {
        let addr = self.resolve()?;
        let mut s = loop {
            let left = deadline.saturating_duration_since(Instant::now());
            if left.is_zero() {
                return Err(self.err(format!("rank 0 not reachable within {:?}", self.timeout)));
            }
            match TcpStream::connect_timeout(&addr, left.min(Duration::from_secs(1))) {
                Ok(s) => break s,
                // Rank 0 may not listen yet.
                Err(_) => std::thread::sleep(Duration::from_millis(50)),
            }
        };
        let left = deadline
            .saturating_duration_since(Instant::now())
            .max(Duration::from_millis(100));
        let io = |e: std::io::Error| self.err(e.to_string());
        s.set_read_timeout(Some(left)).map_err(io)?;
        s.set_write_timeout(Some(left)).map_err(io)?;
        let mut hello = Vec::with_capacity(HELLO);
        hello.extend_from_slice(&TAG);
        hello.extend_from_slice(&(self.rank as u32).to_le_bytes());
        hello.extend_from_slice(&(self.world as u32).to_le_bytes());
        s.write_all(&hello)
            .map_err(|e| self.err(format!("hello to rank 0: {e}")))?;
        let mut out = vec![0u8; len];
        s.read_exact(&mut out)
            .map_err(|e| self.err(format!("no answer from rank 0: {e}")))?;
        Ok(out)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn free_port() -> u16 {
        TcpListener::bind("127.0.0.1:0")
            .unwrap()
            .local_addr()
            .unwrap()
            .port()
    }

    #[test]
    fn ranks_receive_rank_zeros_bytes() {
        let addr = format!("127.0.0.1:{}", free_port());
        let payload: Vec<u8> = (0..128).map(|i| (i * 7) as u8).collect();
        let world = 3;
        let handles: Vec<_> = (1..world)
            .map(|r| {
                let spec = DistSpec::new(&addr, r, world, Duration::from_secs(10)).unwrap();
                std::thread::spawn(move || spec.exchange(&[], 128))
            })
            .collect();
        // The other ranks start first and retry until rank 0 listens.
        std::thread::sleep(Duration::from_millis(100));
        let zero = DistSpec::new(&addr, 0, world, Duration::from_secs(10)).unwrap();
        assert_eq!(zero.exchange(&payload, 128).unwrap(), payload);
        for h in handles {
            assert_eq!(h.join().unwrap().unwrap(), payload);
        }
    }

    #[test]
    fn a_missing_rank_or_rank_zero_is_a_timeout_naming_the_address() {
        let addr = format!("127.0.0.1:{}", free_port());
        let zero = DistSpec::new(&addr, 0, 2, Duration::from_millis(300)).unwrap();
        let e = zero.exchange(&[1; 8], 8).unwrap_err().to_string();
        assert!(
            e.contains(&addr) && e.contains("ranks [1] did not join"),
            "{e}"
        );
        let one = DistSpec::new(&addr, 1, 2, Duration::from_millis(300)).unwrap();
        let e = one.exchange(&[], 8).unwrap_err().to_string();
        assert!(e.contains(&addr) && e.contains("not reachable"), "{e}");
    }

    #[test]
    fn bad_addresses_and_ranks_are_refused() {
        let t = Duration::from_millis(200);
        assert!(DistSpec::new("127.0.0.1:1", 2, 2, t).is_err());
        assert!(DistSpec::new("127.0.0.1:1", 0, 1, t).is_err());
        let bad = DistSpec::new("no-such-host.invalid:29500", 1, 2, t).unwrap();
        let e = bad.exchange(&[], 8).unwrap_err().to_string();
        assert!(e.contains("no-such-host.invalid:29500"), "{e}");
        let no_port = DistSpec::new("127.0.0.1", 0, 2, t).unwrap();
        assert!(no_port.exchange(&[0; 8], 8).is_err());
    }

    #[test]
    fn a_stray_connection_is_dropped_and_a_wrong_world_size_refused() {
        let addr = format!("127.0.0.1:{}", free_port());
        let a = addr.clone();
        let zero = std::thread::spawn(move || {
            DistSpec::new(&a, 0, 2, Duration::from_secs(5))
                .unwrap()
                .exchange(&[9; 4], 4)
        });
        std::thread::sleep(Duration::from_millis(100));
        // Garbage, then a rank of a run with another world size: neither gets the bytes.
        let mut junk = TcpStream::connect(&addr).unwrap();
        junk.write_all(b"GET / HTTP/1.0\r\n\r\n").unwrap();
        let wrong = DistSpec::new(&addr, 1, 3, Duration::from_millis(500)).unwrap();
        assert!(wrong.exchange(&[], 4).is_err());
        let right = DistSpec::new(&addr, 1, 2, Duration::from_secs(5)).unwrap();
        assert_eq!(right.exchange(&[], 4).unwrap(), vec![9; 4]);
        assert_eq!(zero.join().unwrap().unwrap(), vec![9; 4]);
    }
}
