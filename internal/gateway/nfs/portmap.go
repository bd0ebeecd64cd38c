package nfs

import (
	"context"

	"github.com/arbor-storage/arbor/internal/gateway/sunrpc"
	"github.com/arbor-storage/arbor/internal/gateway/xdr"
)

// Portmapper (RFC 1833, version 2): for clients that ask where NFS and
// MOUNT listen. Only NULL and GETPORT are served: the answer is the
// gateway's own port for NFS v3, MOUNT v3, NLM v4 and NSM v1 over TCP,
// 0 (not registered) for anything else.
const (
	ProgPortmap  = 100000
	portmapV2    = 2
	pmapGetPort  = 3
	protoTCP     = 6
	pmapNullProc = 0
)

// PortmapProgram returns the portmapper, answering port for NFS, MOUNT,
// NLM and NSM.
func PortmapProgram(port uint32) sunrpc.Program {
	return sunrpc.Program{Prog: ProgPortmap, Low: portmapV2, High: portmapV2,
		Serve: func(_ context.Context, c *sunrpc.Call, _ sunrpc.ConnInfo, w *xdr.Writer) sunrpc.AcceptStat {
			switch c.Proc {
			case pmapNullProc:
				return sunrpc.Success
			case pmapGetPort:
				r := xdr.NewReader(c.Args)
				prog, vers, prot := r.Uint32(), r.Uint32(), r.Uint32()
				r.Uint32()
				if r.Err() != nil {
					return sunrpc.GarbageArgs
				}
				served := (prog == ProgNFS || prog == ProgMount) && vers == Version3 ||
					prog == ProgNLM && vers == nlmV4 || prog == ProgNSM && vers == nsmV1
				if served && prot == protoTCP {
					w.Uint32(port)
				} else {
					w.Uint32(0)
				}
				return sunrpc.Success
			}
			return sunrpc.ProcUnavail
		}}
}
