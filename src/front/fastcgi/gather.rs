//! Body chunks a FastCGI front's writer passes on out of their own buffers: framed as
//! FCGI_STDOUT records whose headers and padding go into the writer's batch, the content
//! written from the backend's buffer by the same `writev` (decision 44), so a page is not
//! copied on its way from the backend to the front server. A chunk holds its backend read
//! buffer until written; the outbox's bound (`OUT_FRAMES`) bounds how many there are.

use std::io::{self, IoSlice};

use bytes::{BufMut, Bytes, BytesMut};
use tokio::io::AsyncWriteExt;

use crate::front::halves::WritePart;
use crate::protocols::fastcgi::{encode_stdout, RecordHeader, RecordType, STREAM_CHUNK_LEN};

/// A chunk of body up to this many bytes is copied into the bytes being gathered; a larger
/// one goes out of its own buffer, one more slice of the same write.
const COPY_UP_TO: usize = 512;

/// At most this many slices per `writev`; a longer gather takes more than one.
const MAX_SLICES: usize = 16;

/// Body chunks the writer passes on out of their own buffers: each goes between the batch's
/// bytes at the offset it was framed at (its record header before it, its padding after).
#[derive(Debug, Default)]
pub(super) struct Gather {
    /// Where in the batch each chunk goes, and the chunk.
    pieces: Vec<(usize, Bytes)>,
    /// The chunks' bytes, all together.
    pub(super) len: usize,
}

impl Gather {
    pub(super) fn is_empty(&self) -> bool {
        self.pieces.is_empty()
    }

    pub(super) fn clear(&mut self) {
        self.pieces.clear();
        self.len = 0;
    }

    /// Frames `data` as FCGI_STDOUT records of request `id`: headers and padding into
    /// `batch`, the content kept aside (copied in when it is short).
    pub(super) fn data(&mut self, id: u16, mut data: Bytes, batch: &mut BytesMut) {
        if data.len() <= COPY_UP_TO {
            encode_stdout(id, &data, batch);
            return;
        }
        while !data.is_empty() {
            let part = data.split_to(data.len().min(STREAM_CHUNK_LEN));
            // At most STREAM_CHUNK_LEN, so it fits.
            let len = u16::try_from(part.len()).unwrap_or(u16::MAX);
            let header = RecordHeader::new(RecordType::Stdout, id, len);
            batch.extend_from_slice(&header.to_bytes());
            self.len += part.len();
            self.pieces.push((batch.len(), part));
            batch.put_bytes(0, usize::from(header.padding_len));
        }
    }

    /// Writes `batch` with the chunks in their places, in as few `writev`s as it takes.
    pub(super) async fn write(&self, writer: &mut WritePart<'_>, batch: &[u8]) -> io::Result<()> {
        let total = batch.len() + self.len;
        let mut done = 0;
        while done < total {
            let mut slices = [IoSlice::new(&[]); MAX_SLICES];
            let n = self.slices(batch, done, &mut slices);
            let written = writer.write_vectored(&slices[..n]).await?;
            if written == 0 {
                return Err(io::ErrorKind::WriteZero.into());
            }
            done += written;
        }
        Ok(())
    }

    /// Fills `slices` with what follows the first `skip` bytes, in order; returns how many.
    fn slices<'a>(&'a self, batch: &'a [u8], skip: usize, slices: &mut [IoSlice<'a>]) -> usize {
        let mut left = Placing { skip, n: 0 };
        let mut from = 0;
        for (at, chunk) in &self.pieces {
            left.place(batch.get(from..*at).unwrap_or_default(), slices);
            left.place(chunk, slices);
            from = *at;
        }
        left.place(batch.get(from..).unwrap_or_default(), slices);
        left.n
    }
}

/// Where [`Gather::slices`] stands: bytes still to skip, slices filled.
struct Placing {
    skip: usize,
    n: usize,
}

impl Placing {
    fn place<'a>(&mut self, part: &'a [u8], slices: &mut [IoSlice<'a>]) {
        if self.skip >= part.len() {
            self.skip -= part.len();
            return;
        }
        if let Some(slot) = slices.get_mut(self.n) {
            *slot = IoSlice::new(part.get(self.skip..).unwrap_or_default());
            self.skip = 0;
            self.n += 1;
        }
    }
}

#[cfg(test)]
mod tests {
    use bytes::{Bytes, BytesMut};

    use super::Gather;

    /// A write that took part of the gathered bytes goes on from the byte after, whether
    /// that is in the batch or in a chunk, and a long gather fills at most the slices given.
    #[test]
    fn the_slices_after_a_partial_write_start_at_the_first_byte_not_written() {
        let mut gather = Gather::default();
        let mut batch = BytesMut::from(&b"ab"[..]);
        gather.data(1, Bytes::from(vec![7u8; 601]), &mut batch);
        batch.extend_from_slice(b"yz");
        let all: Vec<u8> = {
            let mut slices = [std::io::IoSlice::new(&[]); 8];
            let n = gather.slices(&batch, 0, &mut slices);
            slices[..n].iter().flat_map(|s| s.to_vec()).collect()
        };
        // ab, the record header, 601 bytes, 7 of padding, yz.
        assert_eq!(all.len(), 2 + 8 + 601 + 7 + 2);
        assert_eq!(all[2 + 8 + 601..], [0, 0, 0, 0, 0, 0, 0, b'y', b'z']);
        for skip in [0, 1, 2, 5, 10, 11, 610, 611, 612, 617, 618, all.len() - 1] {
            let mut slices = [std::io::IoSlice::new(&[]); 8];
            let n = gather.slices(&batch, skip, &mut slices);
            let rest: Vec<u8> = slices[..n].iter().flat_map(|s| s.to_vec()).collect();
            assert_eq!(rest, all[skip..], "after {skip} bytes");
            assert!(slices[..n].iter().all(|s| !s.is_empty()));
        }
        let mut one = [std::io::IoSlice::new(&[]); 1];
        assert_eq!(gather.slices(&batch, 3, &mut one), 1);
        assert_eq!(
            &*one[0],
            &all[3..10],
            "the rest of the batch before the chunk"
        );
        // A short chunk is copied in: nothing kept aside.
        let mut short = Gather::default();
        short.data(1, Bytes::from_static(b"hi"), &mut batch);
        assert!(short.is_empty());
    }
}
