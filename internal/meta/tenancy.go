package meta

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"sync"
	"syscall"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/arbor-storage/arbor/internal/directory"
	dpb "github.com/arbor-storage/arbor/internal/directory/directorypb"
	pb "github.com/arbor-storage/arbor/internal/meta/metapb"
	"github.com/arbor-storage/arbor/internal/security"
)

// Tenancy (issue 15; DESIGN §2.8). A file system belongs to the tenant its
// directory record names (dpb.FileSystem.Tenant, set at create). A caller
// whose certificate names a tenant reaches only that tenant's file
// systems: every Meta request it sends is checked, after the node's
// interceptors derived its identity and before the handler runs, against
// the owner of the file system the request names (its header's, or the
// field naming it); any other is refused with codes.PermissionDenied and
// nothing runs. The owner is read from the directory once per file system
// and kept (a file system's tenant never changes and its number is never
// reused). Nodes (other metadata servers, gateways) and administrators
// reach every file system; a node checks its own callers (the NFS gateway
// serves exports, not tenants). The tenant is always the authenticated
// one: a request's tenant field only says, for an administrator's create,
// whom the new file system is for.

// ownerCache maps file-system numbers to their tenants.
type ownerCache struct {
	mu sync.Mutex
	m  map[uint64]string
}

// fsTenant returns the tenant that owns file system f.
func (s *Server) fsTenant(ctx context.Context, f uint64) (string, error) {
	s.owners.mu.Lock()
	t, ok := s.owners.m[f]
	s.owners.mu.Unlock()
	if ok {
		return t, nil
	}
	rec, err := s.cfg.Directory.GetFileSystem(ctx, &dpb.GetFileSystemRequest{Number: f})
	if err != nil {
		return "", err
	}
	s.owners.mu.Lock()
	if s.owners.m == nil {
		s.owners.m = map[uint64]string{}
	}
	s.owners.m[f] = rec.GetTenant()
	s.owners.mu.Unlock()
	return rec.GetTenant(), nil
}

// lookupError is the answer to a tenant whose request names a file system
// the directory could not resolve: refused (fail closed), or Unavailable
// if the directory gave no answer (the client asks again).
func lookupError(f uint64, name string, err error) error {
	if errors.Is(err, directory.ErrNotFound) {
		return security.PermissionDenied("no file system %d %q of yours", f, name)
	}
	if directory.IsRefusal(err) {
		return security.PermissionDenied("file system %d %q: %v", f, name, err)
	}
	return status.Errorf(codes.Unavailable, "meta: resolve the owner of file system %d %q: %v", f, name, err)
}

// ownedBy refuses unless file system f belongs to tenant t.
func (s *Server) ownedBy(ctx context.Context, f uint64, t string) error {
	if f == 0 {
		return security.PermissionDenied("no file system named")
	}
	owner, err := s.fsTenant(ctx, f)
	if err != nil {
		return lookupError(f, "", err)
	}
	if owner != t {
		return security.PermissionDenied("file system %d is not tenant %q's", f, t)
	}
	return nil
}

// namedOwnedBy refuses unless the file system named name, if it exists,
// belongs to tenant t.
func (s *Server) namedOwnedBy(ctx context.Context, name, t string) error {
	rec, err := s.cfg.Directory.GetFileSystem(ctx, &dpb.GetFileSystemRequest{Name: name})
	if errors.Is(err, directory.ErrNotFound) {
		return nil
	}
	if err != nil {
		return lookupError(0, name, err)
	}
	if rec.GetTenant() != t {
		return security.PermissionDenied("file system %q is not tenant %q's", name, t)
	}
	return nil
}

// checkTenancy refuses a tenant's request that names a file system of
// another tenant (or no file system, or one it cannot resolve), or a
// method that is not the tenants'.
func (s *Server) checkTenancy(ctx context.Context, method string, req any) error {
	t, ok := security.CallerTenant(ctx)
	if !ok {
		return nil
	}
	switch r := req.(type) {
	case interface{ GetHeader() *pb.Header }:
		return s.ownedBy(ctx, r.GetHeader().GetFs(), t)
	case *pb.CreateFileSystemRequest:
		if r.GetTenant() != "" && r.GetTenant() != t {
			return security.PermissionDenied("tenant %q may not create a file system for tenant %q", t, r.GetTenant())
		}
		return s.namedOwnedBy(ctx, r.GetName(), t)
	case *pb.DeleteFileSystemRequest:
		return s.namedOwnedBy(ctx, r.GetName(), t)
	case *pb.CreateSnapshotRequest, *pb.DeleteSnapshotRequest, *pb.CheckRequest, *pb.WaitSafeRequest:
		return s.ownedBy(ctx, r.(interface{ GetFs() uint64 }).GetFs(), t)
	case *pb.TableStatsRequest, *pb.ProgressRequest:
		// Answers are filtered (TableStats) or name a job by its random
		// id (Progress).
		return nil
	}
	return security.PermissionDenied("%s is not open to tenants", method)
}

// filterForTenant drops from a tenant's answer what belongs to other
// tenants' file systems.
func (s *Server) filterForTenant(ctx context.Context, resp any) (any, error) {
	t, ok := security.CallerTenant(ctx)
	if !ok {
		return resp, nil
	}
	if r, ok := resp.(*pb.TableStatsResponse); ok {
		var err error
		r.Tables = slices.DeleteFunc(r.Tables, func(ts *pb.TableStats) bool {
			owner, lerr := s.fsTenant(ctx, ts.GetFs())
			if lerr != nil && !errors.Is(lerr, directory.ErrNotFound) {
				err = lerr
			}
			return lerr != nil || owner != t
		})
		if err != nil {
			return nil, lookupError(0, "", err)
		}
	}
	return resp, nil
}

// serviceDesc is the Meta service with every method guarded by
// checkTenancy and filterForTenant.
func (s *Server) serviceDesc() *grpc.ServiceDesc {
	return security.GuardService(&pb.Meta_ServiceDesc, security.Guard{
		Check:  s.checkTenancy,
		Filter: func(ctx context.Context, _ string, resp any) (any, error) { return s.filterForTenant(ctx, resp) },
	})
}

// effectiveTenant is the tenant a new file system is for: the caller's
// own if it is a tenant (checkTenancy refused any other), else the one
// the request names (an administrator's or a node's choice; empty: the
// cluster's own).
func effectiveTenant(ctx context.Context, requested string) (string, error) {
	if t, ok := security.CallerTenant(ctx); ok {
		return t, nil
	}
	if requested != "" {
		if err := security.CheckName(requested); err != nil {
			return "", invalidf("tenant: %v", err)
		}
	}
	return requested, nil
}

// errOtherTenant: a create named an existing file system of another tenant.
func errOtherTenant(name, owner, want string) error {
	return fmt.Errorf("meta: file system %q exists and belongs to tenant %q, not %q: %w", name, owner, want, syscall.EEXIST)
}
