//! Where the peer-table exchange keeps the records it has (`gather.rs`):
//! end to end, newest last, in anonymous memory that goes back to the
//! system when the exchange ends.
//!
//! The records are every rank's, ~100 bytes each (200 KiB at 2,048 ranks),
//! and live only until the table is built from them. From the heap, the
//! allocator kept what they had used (a rank's memory then grew with the
//! job's size by more than what it holds); a map of its own is unmapped
//! when dropped. Each step of the exchange brings older records, so the
//! buffer fills from its back: a step's records go in front of those
//! already there, without moving them.

use memmap2::MmapMut;

/// Records end to end in `map[start..]`.
pub(super) struct ExchangeBuf {
    map: MmapMut,
    start: usize,
}

impl ExchangeBuf {
    /// Room for about `capacity` bytes (it grows when a step brings more).
    pub fn with_capacity(capacity: usize) -> std::io::Result<ExchangeBuf> {
        let map = MmapMut::map_anon(capacity.max(1))?;
        let start = map.len();
        Ok(ExchangeBuf { map, start })
    }

    /// The records, oldest first.
    pub fn bytes(&self) -> &[u8] {
        &self.map[self.start..]
    }

    /// Room for `len` more bytes in front of the records, first growing
    /// the buffer (to twice what it needs) when there is not.
    pub fn front(&mut self, len: usize) -> std::io::Result<&mut [u8]> {
        if len > self.start {
            let held = self.map.len() - self.start;
            let mut bigger = MmapMut::map_anon(2 * (held + len))?;
            let at = bigger.len() - held;
            bigger[at..].copy_from_slice(self.bytes());
            self.map = bigger;
            self.start = at;
        }
        Ok(&mut self.map[self.start - len..self.start])
    }

    /// The `len` bytes in front (written through [`ExchangeBuf::front`])
    /// now belong to the records.
    pub fn claim(&mut self, len: usize) {
        assert!(len <= self.start, "claiming more than the room in front");
        self.start -= len;
    }
}

/// One step's records as they arrived, in a map of their own (half the
/// job's records at the last step), until they go in front of the others.
pub(super) struct Received {
    map: MmapMut,
    len: usize,
}

impl Received {
    /// `len` bytes read from `from`.
    pub fn read(from: &mut impl std::io::Read, len: usize) -> std::io::Result<Received> {
        let mut map = MmapMut::map_anon(len.max(1))?;
        from.read_exact(&mut map[..len])?;
        Ok(Received { map, len })
    }
}

impl std::ops::Deref for Received {
    type Target = [u8];
    fn deref(&self) -> &[u8] {
        &self.map[..self.len]
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn records_go_in_front_and_the_buffer_grows_keeping_them() {
        let mut b = ExchangeBuf::with_capacity(4).unwrap();
        b.front(3).unwrap().copy_from_slice(b"cde");
        b.claim(3);
        assert_eq!(b.bytes(), b"cde");
        // More than the room left: the buffer grows, the records stay.
        b.front(2).unwrap().copy_from_slice(b"ab");
        b.claim(2);
        assert_eq!(b.bytes(), b"abcde");
        let got = Received::read(&mut &b"0123456"[..], 6).unwrap();
        assert_eq!(&got[..], b"012345");
        b.front(6).unwrap().copy_from_slice(&got);
        b.claim(6);
        assert_eq!(b.bytes(), b"012345abcde");
        assert!(Received::read(&mut &b"01"[..], 3).is_err(), "a short read");
    }
}
