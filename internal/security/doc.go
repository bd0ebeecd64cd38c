// Package security is arbor's transport security and authentication
// (issue 15, the foundation of DESIGN's tenancy; FSS §3 checks the tenant
// of every page access, Ursa Minor §2 checks the caller at every storage
// node): a cluster certificate authority, the certificates it signs for
// nodes, administrators and tenants, the mutual-TLS configurations of
// servers and clients, and the server interceptors that derive the
// caller's identity from its verified certificate and authorize each RPC.
//
// Identities. Every certificate the CA signs names exactly one identity in
// a URI subject alternative name:
//
//	arbor://node/NAME     a node (server and client usage; NAME is the
//	                      node's name, "node-3" in a dev cluster)
//	arbor://admin         an administrator (client usage)
//	arbor://tenant/T      a client of tenant T (client usage)
//
// The subject's common name repeats the holder's name for people reading
// the certificate; only the URI counts. A tenant is its name: everything
// it owns (file systems, blobs, its KV space, ExtentTenant's block owner)
// is keyed by the name, so a name is given to a new tenant only once
// nothing of an earlier tenant of that name remains, its credentials
// included (arbor tenant create and delete: cmd/arbor/tenant.go). Names are 1 to 64 letters, digits,
// '.', '_' or '-', starting with a letter or digit.
//
// Files. A CA directory holds ca.crt and ca.key (0600). Certificates and
// keys are PEM: "CERTIFICATE" blocks and PKCS #8 "PRIVATE KEY" blocks of
// ECDSA P-256 keys. A credential file (--credentials, $ARBOR_CREDENTIALS)
// is one PEM file holding, in any order, exactly one PRIVATE KEY, the one
// leaf CERTIFICATE whose public key is that key's, and one or more CA
// CERTIFICATEs (basic constraints CA:TRUE) that the holder trusts to sign
// the servers' certificates.
//
// Invariants:
//  1. A server built from ServerTLS accepts only connections whose client
//     certificate chains to the cluster CA, is within its validity period
//     and has client-auth usage; anything else fails the TLS handshake, so
//     no RPC handler runs for it.
//  2. A client built from ClientTLS talks only to servers whose
//     certificate chains to the CA, names the dialled host and carries a
//     node identity: a tenant's or administrator's certificate cannot
//     serve as a node.
//  3. The identity an RPC handler sees (FromContext) is derived from the
//     verified peer certificate, never from anything the caller sends. It
//     is derived once per connection, in the handshake (ServerCredentials
//     gives the connection an IdentityInfo).
//  4. Every RPC is authorized by its method's class (Policy): node-only
//     methods (the raft transport, replication between replicas) refuse
//     every identity but a node; admin methods
//     (cluster configuration) refuse tenants; ClassAny methods accept any
//     verified identity. The policy fails closed: a method it does not
//     name is refused to every identity, and every method of every arbor
//     service is named (TestDefaultPolicyClassifiesEveryMethod). Refusals
//     are codes.PermissionDenied and run nothing.
//  5. Tenants own their data: each service checks, in a Guard that runs
//     inside the interceptor chain before its handler (GuardService),
//     that a tenant's request names only its own data (CallerTenant):
//     the metadata service the owner of the file system (its directory
//     record), the tractservers the owner of the blob (its metadata), the
//     extent servers the owner tag of every page and block, which for a
//     tenant must be ExtentTenant of its name (FSS §3), the directory the
//     tenant's own file systems, tables and configuration keys (the extent
//     servers check a transaction that a step or query names only by id
//     against the part its record holds, in the handler, at the leader).
//     Anything else is refused with PermissionDenied and runs nothing;
//     FilterError drops other tenants' identities from refusals (an
//     extent page's prepared holder). Nodes and administrators reach
//     every tenant's data.
package security
