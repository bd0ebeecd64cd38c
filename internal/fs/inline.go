package fs

import (
	"fmt"
)

// Inline data of a small file over several keys (doc.go, Data). A file
// of at most MaxInlineBytes keeps its bytes in its block pair (offset 0)
// and, past the first InlineChunkBytes, in chunks F, 1, D, C, 8, i (i
// from 1), each at most InlineChunkBytes. A chunk has the versions of the
// pair it belongs to: the chunks of the pair version at S are the keys
// (F, 1, D, C, 8, i, -S), written and deleted in the same transaction as
// that version. A pair changed in place (no snapshot sees it) has its
// chunks rewritten in place; a pair copied on write (a new version at W)
// gets new chunks at W and leaves the old version's to the snapshots
// that read it, until the sweep removes that version and its chunks
// together. So a reader of the pair version at S reads exactly the
// chunks at S, and the generic rules of versions (has-older, the sweep's
// needed versions) do not apply to chunk keys.

// inlineChunks returns how many chunks hold inline data of length n past
// the pair's first part.
func inlineChunks(n uint64) uint64 {
	if n <= InlineChunkBytes {
		return 0
	}
	return (n - 1) / InlineChunkBytes
}

// readInlineChunks completes e, decoded from h's block pair version at S,
// with the data of its chunks: e.Inline then holds all e.Length bytes.
// It does nothing for a block that is not inline.
func readInlineChunks(tx MetaTxn, k keys, h Handle, s uint64, e *blockEntry) error {
	if !e.inline() || inlineChunks(e.Length) == 0 {
		return nil
	}
	data := make([]byte, 0, e.Length)
	data = append(data, e.Inline...)
	for i := uint64(1); i <= inlineChunks(e.Length); i++ {
		v, ok, err := tx.Get(versioned(k.inlineChunk(h, i), s))
		if err != nil {
			return err
		}
		if !ok {
			return fmt.Errorf("%w: inline chunk %d of %v at version %d is missing", errCorrupt, i, h, s)
		}
		_, chunk, err := decodeVersioned(v)
		if err != nil {
			return err
		}
		want := min(e.Length-i*InlineChunkBytes, InlineChunkBytes)
		if uint64(len(chunk)) != want {
			return fmt.Errorf("%w: inline chunk %d of %v at version %d holds %d bytes, want %d", errCorrupt, i, h, s, len(chunk), want)
		}
		data = append(data, chunk...)
	}
	e.Inline = data
	return nil
}

// putBlock writes e as the newest version of h's block pair at off, whose
// current version is cur; old is cur's entry (nil if cur is not live), its
// inline data complete or not. An inline e holds all its data: the pair
// takes the first part, chunks at the version written the rest, and
// chunks of old the new version replaces in place and no longer needs are
// deleted. It returns the version written.
func (w *wtx) putBlock(k keys, h Handle, off uint64, cur version, old *blockEntry, e blockEntry) (uint64, error) {
	s := w.putVersion(cur)
	if err := w.put(k.block(h, off), cur, e.encode()); err != nil {
		return 0, err
	}
	var n uint64
	if e.inline() {
		n = inlineChunks(e.Length)
		for i := uint64(1); i <= n; i++ {
			chunk := e.Inline[i*InlineChunkBytes : min(uint64(len(e.Inline)), (i+1)*InlineChunkBytes)]
			if err := w.tx.Put(versioned(k.inlineChunk(h, i), s), encodeVersioned(0, chunk)); err != nil {
				return 0, err
			}
		}
	}
	if cur.live() && cur.S == s && old != nil && old.inline() {
		for i := n + 1; i <= inlineChunks(old.Length); i++ {
			if err := w.tx.Delete(versioned(k.inlineChunk(h, i), s)); err != nil {
				return 0, err
			}
		}
	}
	return s, nil
}

// delBlock removes h's block pair at off from W on (del), whose current
// version is cur with entry old; when the version goes (no snapshot reads
// it), so do its chunks.
func (w *wtx) delBlock(k keys, h Handle, off uint64, cur version, old *blockEntry) error {
	if err := w.del(k.block(h, off), cur); err != nil {
		return err
	}
	if cur.live() && (cur.S == w.epoch || !w.shared(cur)) && old != nil && old.inline() {
		return deleteInlineChunks(w.tx, k, h, cur.S, old.Length)
	}
	return nil
}

// deleteInlineChunks deletes the chunks of h's inline block pair version
// at s, of length n.
func deleteInlineChunks(tx MetaTxn, k keys, h Handle, s, n uint64) error {
	for i := uint64(1); i <= inlineChunks(n); i++ {
		if err := tx.Delete(versioned(k.inlineChunk(h, i), s)); err != nil {
			return err
		}
	}
	return nil
}
