package sunrpc

import (
	"bufio"
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"sync"
	"time"

	"github.com/arbor-storage/arbor/internal/gateway/xdr"
)

// Limits of the server.
const (
	// MaxRecordBytes bounds one message: an NFS WRITE of the largest
	// size the gateway offers (1 MiB) and its header fit.
	MaxRecordBytes = 1<<20 + 64<<10
	// MaxInFlightPerConn bounds the calls one connection runs at once.
	MaxInFlightPerConn = 64
	// idleTimeout closes a connection that sent nothing for this long.
	idleTimeout = 15 * time.Minute
	// writeTimeout bounds writing one reply.
	writeTimeout = time.Minute
)

// ErrRecordTooLong says a record was longer than MaxRecordBytes.
var ErrRecordTooLong = errors.New("sunrpc: record too long")

// ReadRecord reads one record (its fragments joined) of at most max bytes.
func ReadRecord(r io.Reader, max int) ([]byte, error) {
	var rec []byte
	var hdr [4]byte
	for {
		if _, err := io.ReadFull(r, hdr[:]); err != nil {
			if len(rec) > 0 && errors.Is(err, io.EOF) {
				err = io.ErrUnexpectedEOF
			}
			return nil, err
		}
		h := binary.BigEndian.Uint32(hdr[:])
		last, n := h&(1<<31) != 0, int(h&^(1<<31))
		if len(rec)+n > max {
			return nil, fmt.Errorf("%w: more than %d bytes", ErrRecordTooLong, max)
		}
		start := len(rec)
		rec = append(rec, make([]byte, n)...)
		if _, err := io.ReadFull(r, rec[start:]); err != nil {
			if errors.Is(err, io.EOF) {
				err = io.ErrUnexpectedEOF
			}
			return nil, err
		}
		if last {
			return rec, nil
		}
	}
}

// WriteRecord writes msg as one record of one fragment.
func WriteRecord(w io.Writer, msg []byte) error {
	b := make([]byte, 4, 4+len(msg))
	binary.BigEndian.PutUint32(b, 1<<31|uint32(len(msg)))
	_, err := w.Write(append(b, msg...))
	return err
}

// Program serves one RPC program's versions Low..High.
type Program struct {
	Prog, Low, High uint32
	// Serve runs procedure c.Proc of version c.Vers and writes its results
	// to w. It returns Success, ProcUnavail, GarbageArgs (nothing written
	// is sent then) or SystemErr.
	Serve func(ctx context.Context, c *Call, conn ConnInfo, w *xdr.Writer) AcceptStat
}

// ConnInfo says where a call came from.
type ConnInfo struct {
	Remote, Local net.Addr
}

// Server serves registered programs on TCP connections.
type Server struct {
	log      *slog.Logger
	programs map[uint32]Program

	mu    sync.Mutex
	lis   []net.Listener
	conns map[net.Conn]struct{}
	done  bool
	wg    sync.WaitGroup
}

// NewServer returns a server of programs.
func NewServer(log *slog.Logger, programs ...Program) *Server {
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	s := &Server{log: log, programs: map[uint32]Program{}, conns: map[net.Conn]struct{}{}}
	for _, p := range programs {
		s.programs[p.Prog] = p
	}
	return s
}

// Serve accepts connections on lis until Close.
func (s *Server) Serve(lis net.Listener) error {
	s.mu.Lock()
	if s.done {
		s.mu.Unlock()
		return net.ErrClosed
	}
	s.lis = append(s.lis, lis)
	s.mu.Unlock()
	for {
		conn, err := lis.Accept()
		if err != nil {
			s.mu.Lock()
			done := s.done
			s.mu.Unlock()
			if done {
				return nil
			}
			var ne net.Error
			if errors.As(err, &ne) && ne.Timeout() {
				time.Sleep(10 * time.Millisecond)
				continue
			}
			return err
		}
		s.mu.Lock()
		if s.done {
			s.mu.Unlock()
			conn.Close()
			return nil
		}
		s.conns[conn] = struct{}{}
		s.wg.Add(1)
		s.mu.Unlock()
		go s.serveConn(conn)
	}
}

// Close stops accepting, closes every connection and waits for the calls
// running to end.
func (s *Server) Close() error {
	s.mu.Lock()
	s.done = true
	for _, l := range s.lis {
		l.Close()
	}
	for c := range s.conns {
		c.Close()
	}
	s.mu.Unlock()
	s.wg.Wait()
	return nil
}

func (s *Server) serveConn(conn net.Conn) {
	ctx, cancel := context.WithCancel(context.Background())
	var calls sync.WaitGroup
	defer func() {
		cancel()
		conn.Close()
		calls.Wait()
		s.mu.Lock()
		delete(s.conns, conn)
		s.mu.Unlock()
		s.wg.Done()
	}()
	info := ConnInfo{Remote: conn.RemoteAddr(), Local: conn.LocalAddr()}
	br := bufio.NewReaderSize(conn, 64<<10)
	var wmu sync.Mutex
	send := func(msg []byte) {
		wmu.Lock()
		defer wmu.Unlock()
		_ = conn.SetWriteDeadline(time.Now().Add(writeTimeout))
		if err := WriteRecord(conn, msg); err != nil {
			conn.Close() // the reader sees it and ends the connection
		}
	}
	slots := make(chan struct{}, MaxInFlightPerConn)
	for {
		_ = conn.SetReadDeadline(time.Now().Add(idleTimeout))
		rec, err := ReadRecord(br, MaxRecordBytes)
		if err != nil {
			if !errors.Is(err, io.EOF) && !errors.Is(err, net.ErrClosed) {
				s.log.Debug("rpc connection ends", "remote", info.Remote, "err", err)
			}
			return
		}
		c, perr := ParseCall(rec)
		if perr != nil {
			var ve *versionError
			var ce *credError
			switch {
			case errors.As(perr, &ve):
				send(deniedReply(c.Xid, true))
				continue
			case errors.As(perr, &ce):
				send(deniedReply(c.Xid, false))
				continue
			case len(rec) < 8:
				s.log.Debug("rpc message without a header; closing", "remote", info.Remote)
				return
			default:
				// A call whose header is cut short: its xid is known.
				send(acceptedHeader(c.Xid, GarbageArgs).Bytes())
				continue
			}
		}
		select {
		case slots <- struct{}{}:
		case <-ctx.Done():
			return
		}
		calls.Add(1)
		go func() {
			defer func() { <-slots; calls.Done() }()
			send(s.dispatch(ctx, &c, info))
		}()
	}
}

// dispatch runs one call and returns its reply.
func (s *Server) dispatch(ctx context.Context, c *Call, info ConnInfo) (reply []byte) {
	p, ok := s.programs[c.Prog]
	if !ok {
		return acceptedHeader(c.Xid, ProgUnavail).Bytes()
	}
	if c.Vers < p.Low || c.Vers > p.High {
		return mismatchReply(c.Xid, p.Low, p.High)
	}
	defer func() {
		if r := recover(); r != nil {
			s.log.Error("rpc procedure panicked", "prog", c.Prog, "proc", c.Proc, "panic", r)
			reply = acceptedHeader(c.Xid, SystemErr).Bytes()
		}
	}()
	w := acceptedHeader(c.Xid, Success)
	st := p.Serve(ctx, c, info, w)
	if st != Success {
		return acceptedHeader(c.Xid, st).Bytes()
	}
	return w.Bytes()
}
