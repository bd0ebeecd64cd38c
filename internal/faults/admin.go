package faults

import (
	"context"
	"log/slog"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/arbor-storage/arbor/internal/faults/faultspb"
)

// AdminServer serves the Admin gRPC service over an Injector.
type AdminServer struct {
	faultspb.UnimplementedAdminServer
	in     *Injector
	logger *slog.Logger
}

// NewAdminServer returns the Admin service of in; logger (nil: discard)
// records every change, so a test's log shows when it cut what.
func NewAdminServer(in *Injector, logger *slog.Logger) *AdminServer {
	if logger == nil {
		logger = slog.New(slog.DiscardHandler)
	}
	return &AdminServer{in: in, logger: logger}
}

// GetFaults returns the injector's state.
func (a *AdminServer) GetFaults(context.Context, *faultspb.GetFaultsRequest) (*faultspb.FaultsState, error) {
	return State(a.in), nil
}

// SetFaults changes the configuration and the blocked set. Everything is
// validated before anything changes, so a bad request changes nothing.
func (a *AdminServer) SetFaults(_ context.Context, req *faultspb.SetFaultsRequest) (*faultspb.FaultsState, error) {
	u := Update{
		ReplaceBlocked: req.Blocked != nil,
		Blocked:        req.GetBlocked().GetNodes(),
		Block:          req.GetBlock(),
		Unblock:        req.GetUnblock(),
	}
	if req.Config != nil {
		cfg, err := Parse(req.GetConfig())
		if err != nil {
			return nil, status.Error(codes.InvalidArgument, err.Error())
		}
		u.Config = &cfg
	}
	if err := a.in.Apply(u); err != nil {
		return nil, status.Error(codes.InvalidArgument, err.Error())
	}
	st := State(a.in)
	a.logger.Info("faults changed through admin", "faults", st.GetConfig(), "blocked", st.GetBlocked())
	return st, nil
}

// State returns in's configuration ("off" when it injects nothing),
// blocked set and counts as a message.
func State(in *Injector) *faultspb.FaultsState {
	c := in.Counts()
	cfg := in.Config()
	shown := "off" // a seed alone is not worth showing
	if cfg.Enabled() {
		shown = cfg.String()
	}
	return &faultspb.FaultsState{
		NodeId:  in.NodeID(),
		Config:  shown,
		Blocked: in.Blocked(),
		Counts: &faultspb.FaultCounts{
			RequestsLost:        c.RequestsLost,
			RepliesLost:         c.RepliesLost,
			CallsDelayed:        c.CallsDelayed,
			CallsDuplicated:     c.CallsDuplicated,
			MessagesDropped:     c.MessagesDropped,
			MessagesDelayed:     c.MessagesDelayed,
			MessagesDuplicated:  c.MessagesDuplicated,
			PartitionRejections: c.PartitionRejections,
		},
	}
}
