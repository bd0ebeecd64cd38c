/*
 * nfsfuse: a FUSE mount whose NFS side is the libnfs client library, so
 * that pjdfstest (and anything else written against POSIX) can run through
 * an NFSv3 client that no one here wrote against Arbor's NFS gateway
 * (issue 14; scripts/pjdfstest.sh --nfs, `make pjdfstest-nfs`).
 *
 *   nfsfuse [FUSE options] 'nfs://HOST/EXPORT?nfsport=P&mountport=P' MOUNTPOINT
 *
 * It is deliberately thin: every FUSE call is one libnfs call (or a few),
 * made with the calling process's credentials. The caller's uid, gid and
 * supplementary groups (the FUSE context) become the AUTH_SYS credential
 * of the NFS calls it causes, so the gateway, not the kernel and not this
 * bridge, decides what is permitted: the mount runs without
 * default_permissions. One libnfs context serves every caller; the bridge
 * is single threaded (-s), and swaps the context's credential before each
 * call.
 *
 * Attributes and names are not cached (timeouts 0) and I/O is direct, so
 * each system call reaches the gateway. SETATTR is sent raw (libnfs's own
 * chown, chmod and utimes cannot leave a field unchanged nor carry
 * nanoseconds), after a LOOKUP walk that does not follow the last
 * component, which is what lchown and utimensat(AT_SYMLINK_NOFOLLOW) need.
 *
 * Built by `make nfsfuse` (bin/nfsfuse); needs libnfs-dev and
 * libfuse3-dev, which scripts/install-deps.sh installs.
 */
#define FUSE_USE_VERSION 35
#define _GNU_SOURCE

#include <errno.h>
#include <fcntl.h>
#include <fuse.h>
#include <poll.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/statvfs.h>
#include <sys/sysmacros.h>
#include <unistd.h>

#include <nfsc/libnfs.h>
#include <nfsc/libnfs-raw.h>
#include <nfsc/libnfs-raw-nfs.h>
#include <nfsc/libnfs-raw-nlm.h>
#include <pthread.h>

/* libnfs 4 keeps struct nfs_fh private (libnfs-private.h); this is its
 * layout, which nfs_get_fh returns. Checked once at start (rootfh). */
struct bridge_fh {
	int len;
	char *val;
};

static struct nfs_context *nfs;
static struct rpc_context *rpc;
/* NLM v4 (byte-range locks), on its own connection to the gateway. */
static struct rpc_context *nlm;
static char hostname[NLM_MAXNAME];
/* The export's root handle, copied at start. */
static char rootfh[NFS3_FHSIZE];
static u_int rootfh_len;
/* The export's longest name, from PATHCONF (libnfs's statvfs says 256). */
static unsigned long name_max = 255;

/* AUTH_SYS carries at most 16 groups (RFC 5531). */
#define NGROUPS_MAX_AUTH 16

/* The credential the context carries now. */
static uid_t cur_uid = (uid_t)-1;
static gid_t cur_gid = (gid_t)-1;
static int cur_ngroups = -1;
static gid_t cur_groups[NGROUPS_MAX_AUTH];

/* One libnfs context serves every FUSE thread: big serialises the calls
 * (CALLER takes it for the rest of the function's scope). */
static pthread_mutex_t big = PTHREAD_MUTEX_INITIALIZER;

static void release_big(int *unused)
{
	(void)unused;
	pthread_mutex_unlock(&big);
}

static int as_caller(void);

#define CALLER                                                                   \
	pthread_mutex_lock(&big);                                                \
	int big_held __attribute__((cleanup(release_big))) = 0;                  \
	(void)big_held;                                                          \
	if (as_caller() != 0)                                                    \
	return -EIO

/* as_caller makes the NFS calls that follow carry the FUSE caller's uid,
 * gid and groups (on both connections: NFS and NLM). It fails rather than
 * leave the previous caller's credential in place: a call made under
 * another user's identity would bypass the server's permission checks. */
static int as_caller(void)
{
	struct fuse_context *fc = fuse_get_context();
	gid_t groups[64];
	int n = fuse_getgroups(64, groups);
	if (n < 0)
		n = 0;
	if (n > NGROUPS_MAX_AUTH)
		n = NGROUPS_MAX_AUTH;
	if (fc->uid == cur_uid && fc->gid == cur_gid && n == cur_ngroups &&
	    memcmp(groups, cur_groups, n * sizeof(gid_t)) == 0)
		return 0;
	uint32_t g32[NGROUPS_MAX_AUTH];
	for (int i = 0; i < n; i++)
		g32[i] = groups[i];
	struct AUTH *auth = libnfs_authunix_create("nfsfuse", fc->uid, fc->gid, n, g32);
	struct AUTH *nlm_auth = libnfs_authunix_create("nfsfuse", fc->uid, fc->gid, n, g32);
	if (auth == NULL || nlm_auth == NULL) {
		fprintf(stderr, "nfsfuse: authunix_create failed\n");
		if (auth != NULL)
			libnfs_auth_destroy(auth);
		if (nlm_auth != NULL)
			libnfs_auth_destroy(nlm_auth);
		return -1;
	}
	rpc_set_auth(rpc, auth);
	rpc_set_auth(nlm, nlm_auth);
	cur_uid = fc->uid;
	cur_gid = fc->gid;
	cur_ngroups = n;
	memcpy(cur_groups, groups, n * sizeof(gid_t));
	return 0;
}

static void to_stat(const struct nfs_stat_64 *n, struct stat *st)
{
	memset(st, 0, sizeof(*st));
	st->st_dev = n->nfs_dev;
	st->st_ino = n->nfs_ino;
	st->st_mode = n->nfs_mode;
	st->st_nlink = n->nfs_nlink;
	st->st_uid = n->nfs_uid;
	st->st_gid = n->nfs_gid;
	st->st_rdev = n->nfs_rdev;
	st->st_size = n->nfs_size;
	st->st_blksize = n->nfs_blksize;
	st->st_blocks = n->nfs_blocks;
	st->st_atim.tv_sec = n->nfs_atime;
	st->st_atim.tv_nsec = n->nfs_atime_nsec;
	st->st_mtim.tv_sec = n->nfs_mtime;
	st->st_mtim.tv_nsec = n->nfs_mtime_nsec;
	st->st_ctim.tv_sec = n->nfs_ctime;
	st->st_ctim.tv_nsec = n->nfs_ctime_nsec;
}

/* ---- raw calls: LOOKUP walk and SETATTR ---- */

struct wait {
	int done;
	int status; /* RPC_STATUS_* */
	int nfsstat;
	char fh[NFS3_FHSIZE];
	u_int fh_len;
	u_int name_max;
};

/* service_until runs context r's event loop until *done is set. */
static int service_until(struct rpc_context *r, const int *done)
{
	while (!*done) {
		struct pollfd pfd = {.fd = rpc_get_fd(r), .events = rpc_which_events(r)};
		if (poll(&pfd, 1, 100) < 0 && errno != EINTR)
			return -errno;
		if (rpc_service(r, pfd.revents) < 0) {
			fprintf(stderr, "nfsfuse: rpc_service: %s\n", rpc_get_error(r));
			return -EIO;
		}
	}
	return 0;
}

/* wait_on waits for the NFS call w on context r. */
static int wait_on(struct rpc_context *r, struct wait *w)
{
	int err = service_until(r, &w->done);
	if (err)
		return err;
	if (w->status != RPC_STATUS_SUCCESS)
		return -EIO;
	if (w->nfsstat != NFS3_OK)
		return nfsstat3_to_errno(w->nfsstat);
	return 0;
}

static int wait_for(struct wait *w) { return wait_on(rpc, w); }

static void lookup_cb(struct rpc_context *r, int status, void *data, void *priv)
{
	struct wait *w = priv;
	(void)r;
	w->done = 1;
	w->status = status;
	if (status != RPC_STATUS_SUCCESS)
		return;
	LOOKUP3res *res = data;
	w->nfsstat = res->status;
	if (res->status == NFS3_OK) {
		nfs_fh3 *o = &res->LOOKUP3res_u.resok.object;
		w->fh_len = o->data.data_len <= NFS3_FHSIZE ? o->data.data_len : 0;
		memcpy(w->fh, o->data.data_val, w->fh_len);
	}
}

/* lookup_path walks path from the export's root, one LOOKUP a component,
 * not following the last one, and leaves its handle in fh. */
static int lookup_path(const char *path, char *fh, u_int *fh_len)
{
	char buf[4096];
	if (strlen(path) >= sizeof(buf))
		return -ENAMETOOLONG;
	strcpy(buf, path);
	memcpy(fh, rootfh, rootfh_len);
	*fh_len = rootfh_len;
	char *save = NULL;
	for (char *name = strtok_r(buf, "/", &save); name != NULL; name = strtok_r(NULL, "/", &save)) {
		struct wait w = {0};
		LOOKUP3args args;
		memset(&args, 0, sizeof(args));
		args.what.dir.data.data_len = *fh_len;
		args.what.dir.data.data_val = fh;
		args.what.name = name;
		if (rpc_nfs3_lookup_async(rpc, lookup_cb, &args, &w) != 0)
			return -EIO;
		int err = wait_for(&w);
		if (err)
			return err;
		memcpy(fh, w.fh, w.fh_len);
		*fh_len = w.fh_len;
	}
	return 0;
}

static void setattr_cb(struct rpc_context *r, int status, void *data, void *priv)
{
	struct wait *w = priv;
	(void)r;
	w->done = 1;
	w->status = status;
	if (status == RPC_STATUS_SUCCESS)
		w->nfsstat = ((SETATTR3res *)data)->status;
}

/* setattr sends one SETATTR of a to the object at path (not following a
 * last symbolic link), or to the open file fi if there is one. */
static int setattr(const char *path, struct fuse_file_info *fi, sattr3 *a)
{
	char fh[NFS3_FHSIZE];
	u_int fh_len;
	CALLER;
	if (fi != NULL && fi->fh != 0) {
		struct bridge_fh *f = (struct bridge_fh *)nfs_get_fh((struct nfsfh *)(uintptr_t)fi->fh);
		if (f->len <= 0 || f->len > NFS3_FHSIZE)
			return -EIO;
		fh_len = f->len;
		memcpy(fh, f->val, fh_len);
	} else {
		int err = lookup_path(path, fh, &fh_len);
		if (err)
			return err;
	}
	SETATTR3args args;
	memset(&args, 0, sizeof(args));
	args.object.data.data_len = fh_len;
	args.object.data.data_val = fh;
	args.new_attributes = *a;
	struct wait w = {0};
	if (rpc_nfs3_setattr_async(rpc, setattr_cb, &args, &w) != 0)
		return -EIO;
	return wait_for(&w);
}

static void pathconf_cb(struct rpc_context *r, int status, void *data, void *priv)
{
	struct wait *w = priv;
	(void)r;
	w->done = 1;
	w->status = status;
	if (status != RPC_STATUS_SUCCESS)
		return;
	PATHCONF3res *res = data;
	w->nfsstat = res->status;
	if (res->status == NFS3_OK)
		w->name_max = res->PATHCONF3res_u.resok.name_max;
}

/* root_name_max asks the export's root for its longest name. */
static int root_name_max(void)
{
	PATHCONF3args args;
	memset(&args, 0, sizeof(args));
	args.object.data.data_len = rootfh_len;
	args.object.data.data_val = rootfh;
	struct wait w = {0};
	if (rpc_nfs3_pathconf_async(rpc, pathconf_cb, &args, &w) != 0)
		return -EIO;
	int err = wait_for(&w);
	if (err == 0)
		name_max = w.name_max;
	return err;
}

/* ---- FUSE operations ---- */

static void *b_init(struct fuse_conn_info *conn, struct fuse_config *cfg)
{
	(void)conn;
	cfg->use_ino = 1;
	/* A file removed while open is renamed .fuse_hidden* until its last
	 * close, as NFS clients do (their "silly rename"): NFS has no open
	 * state, so the server removes what it is told to. */
	cfg->hard_remove = 0;
	cfg->entry_timeout = 0;
	cfg->attr_timeout = 0;
	cfg->negative_timeout = 0;
	cfg->direct_io = 1;
	/* A process waiting for a lock can be interrupted. */
	cfg->intr = 1;
	return NULL;
}

static int b_getattr(const char *path, struct stat *st, struct fuse_file_info *fi)
{
	struct nfs_stat_64 n;
	int err;
	CALLER;
	if (fi != NULL && fi->fh != 0)
		err = nfs_fstat64(nfs, (struct nfsfh *)(uintptr_t)fi->fh, &n);
	else
		err = nfs_lstat64(nfs, path, &n);
	if (err)
		return err;
	to_stat(&n, st);
	return 0;
}

static int b_readlink(const char *path, char *buf, size_t size)
{
	CALLER;
	memset(buf, 0, size);
	int err = nfs_readlink(nfs, path, buf, size);
	if (err)
		return err;
	buf[size - 1] = 0;
	return 0;
}

static int b_mknod(const char *path, mode_t mode, dev_t dev)
{
	CALLER;
	return nfs_mknod(nfs, path, mode, dev);
}

static int b_mkdir(const char *path, mode_t mode)
{
	CALLER;
	return nfs_mkdir2(nfs, path, mode);
}

static int b_unlink(const char *path)
{
	CALLER;
	return nfs_unlink(nfs, path);
}

static int b_rmdir(const char *path)
{
	CALLER;
	return nfs_rmdir(nfs, path);
}

static int b_symlink(const char *target, const char *path)
{
	CALLER;
	return nfs_symlink(nfs, target, path);
}

static int b_rename(const char *from, const char *to, unsigned int flags)
{
	/* NFSv3 has no RENAME_NOREPLACE nor RENAME_EXCHANGE. */
	if (flags)
		return -EINVAL;
	CALLER;
	return nfs_rename(nfs, from, to);
}

static int b_link(const char *from, const char *to)
{
	CALLER;
	return nfs_link(nfs, from, to);
}

static int b_chmod(const char *path, mode_t mode, struct fuse_file_info *fi)
{
	sattr3 a;
	memset(&a, 0, sizeof(a));
	a.mode.set_it = 1;
	a.mode.set_mode3_u.mode = mode & 07777;
	return setattr(path, fi, &a);
}

static int b_chown(const char *path, uid_t uid, gid_t gid, struct fuse_file_info *fi)
{
	sattr3 a;
	memset(&a, 0, sizeof(a));
	if (uid != (uid_t)-1) {
		a.uid.set_it = 1;
		a.uid.set_uid3_u.uid = uid;
	}
	if (gid != (gid_t)-1) {
		a.gid.set_it = 1;
		a.gid.set_gid3_u.gid = gid;
	}
	return setattr(path, fi, &a);
}

static int b_truncate(const char *path, off_t size, struct fuse_file_info *fi)
{
	sattr3 a;
	memset(&a, 0, sizeof(a));
	a.size.set_it = 1;
	a.size.set_size3_u.size = size;
	return setattr(path, fi, &a);
}

static int set_time(time_how *how, nfstime3 *t, const struct timespec *ts)
{
	if (ts->tv_nsec == UTIME_OMIT) {
		*how = DONT_CHANGE;
	} else if (ts->tv_nsec == UTIME_NOW) {
		*how = SET_TO_SERVER_TIME;
	} else if (ts->tv_sec < 0 || ts->tv_sec > UINT32_MAX) {
		/* nfstime3's seconds are 32 bits, unsigned. */
		return -EOVERFLOW;
	} else {
		*how = SET_TO_CLIENT_TIME;
		t->seconds = ts->tv_sec;
		t->nseconds = ts->tv_nsec;
	}
	return 0;
}

static int b_utimens(const char *path, const struct timespec tv[2], struct fuse_file_info *fi)
{
	sattr3 a;
	memset(&a, 0, sizeof(a));
	int err = set_time(&a.atime.set_it, &a.atime.set_atime_u.atime, &tv[0]);
	if (err == 0)
		err = set_time(&a.mtime.set_it, &a.mtime.set_mtime_u.mtime, &tv[1]);
	if (err)
		return err;
	return setattr(path, fi, &a);
}

/* open_flags keeps what libnfs's open understands. */
static int open_flags(int flags)
{
	return flags & (O_ACCMODE | O_APPEND | O_SYNC | O_DSYNC | O_TRUNC | O_NOFOLLOW);
}

static int b_open(const char *path, struct fuse_file_info *fi)
{
	struct nfsfh *fh = NULL;
	CALLER;
	int err = nfs_open(nfs, path, open_flags(fi->flags), &fh);
	if (err)
		return err;
	fi->fh = (uintptr_t)fh;
	fi->direct_io = 1;
	return 0;
}

static int b_create(const char *path, mode_t mode, struct fuse_file_info *fi)
{
	struct nfsfh *fh = NULL;
	CALLER;
	int err = nfs_create(nfs, path, open_flags(fi->flags) | (fi->flags & O_EXCL), mode & 07777, &fh);
	if (err)
		return err;
	fi->fh = (uintptr_t)fh;
	fi->direct_io = 1;
	return 0;
}

static int b_read(const char *path, char *buf, size_t size, off_t off, struct fuse_file_info *fi)
{
	(void)path;
	CALLER;
	size_t done = 0;
	while (done < size) {
		int n = nfs_pread(nfs, (struct nfsfh *)(uintptr_t)fi->fh, off + done, size - done, buf + done);
		if (n < 0)
			return n;
		if (n == 0)
			break;
		done += n;
	}
	return done;
}

static int b_write(const char *path, const char *buf, size_t size, off_t off, struct fuse_file_info *fi)
{
	(void)path;
	CALLER;
	size_t done = 0;
	while (done < size) {
		int n = nfs_pwrite(nfs, (struct nfsfh *)(uintptr_t)fi->fh, off + done, size - done, buf + done);
		if (n < 0)
			return n;
		if (n == 0)
			return -EIO;
		done += n;
	}
	return done;
}

static int b_statfs(const char *path, struct statvfs *sv)
{
	CALLER;
	int err = nfs_statvfs(nfs, path, sv);
	if (err == 0)
		sv->f_namemax = name_max;
	return err;
}

static int b_release(const char *path, struct fuse_file_info *fi)
{
	(void)path;
	CALLER;
	return nfs_close(nfs, (struct nfsfh *)(uintptr_t)fi->fh);
}

static int b_fsync(const char *path, int datasync, struct fuse_file_info *fi)
{
	(void)path;
	(void)datasync;
	CALLER;
	return nfs_fsync(nfs, (struct nfsfh *)(uintptr_t)fi->fh);
}

static int b_readdir(const char *path, void *buf, fuse_fill_dir_t fill, off_t off,
		     struct fuse_file_info *fi, enum fuse_readdir_flags flags)
{
	(void)off;
	(void)fi;
	(void)flags;
	struct nfsdir *dir;
	CALLER;
	int err = nfs_opendir(nfs, path, &dir);
	if (err)
		return err;
	struct nfsdirent *e;
	while ((e = nfs_readdir(nfs, dir)) != NULL) {
		struct stat st;
		memset(&st, 0, sizeof(st));
		st.st_ino = e->inode;
		st.st_mode = e->mode;
		if (fill(buf, e->name, &st, 0, 0))
			break;
	}
	nfs_closedir(nfs, dir);
	return 0;
}

static int b_access(const char *path, int mask)
{
	CALLER;
	if (mask == F_OK) {
		struct nfs_stat_64 n;
		return nfs_lstat64(nfs, path, &n);
	}
	return nfs_access(nfs, path, mask);
}

/* ---- byte-range locks: NLM v4 ---- */

struct nlm_wait {
	int done;
	int status;
	nlmstat4 stat;
	nlm4_holder holder;
};

static void nlm_cb(struct rpc_context *r, int status, void *data, void *priv)
{
	struct nlm_wait *w = priv;
	(void)r;
	w->done = 1;
	w->status = status;
	if (status != RPC_STATUS_SUCCESS)
		return;
	/* LOCK, UNLOCK and CANCEL replies are a cookie and a status;
	 * TEST's add the holder. */
	w->stat = ((NLM4_LOCKres *)data)->status;
}

static void nlm_test_cb(struct rpc_context *r, int status, void *data, void *priv)
{
	struct nlm_wait *w = priv;
	(void)r;
	w->done = 1;
	w->status = status;
	if (status != RPC_STATUS_SUCCESS)
		return;
	NLM4_TESTres *res = data;
	w->stat = res->reply.status;
	if (w->stat == NLM4_DENIED)
		w->holder = res->reply.nlm4_testreply_u.lock.holder;
}

static int nlm_wait(struct nlm_wait *w)
{
	int err = service_until(nlm, &w->done);
	if (err)
		return err;
	return w->status == RPC_STATUS_SUCCESS ? 0 : -EIO;
}

static int nlm_errno(nlmstat4 st)
{
	switch (st) {
	case NLM4_GRANTED:
		return 0;
	case NLM4_DENIED:
	case NLM4_BLOCKED:
		return -EAGAIN;
	case NLM4_DENIED_NOLOCKS:
		return -ENOLCK;
	case NLM4_STALE_FH:
		return -ESTALE;
	case NLM4_FBIG:
		return -EOVERFLOW;
	case NLM4_DEADLCK:
		return -EDEADLK;
	default:
		return -EIO;
	}
}

/* b_lock serves fcntl's F_GETLK, F_SETLK and F_SETLKW with NLM's TEST,
 * LOCK and UNLOCK. The lock owner is the kernel's (one per process and
 * file table); the caller name this host's. A blocking lock that is in
 * another's way is answered BLOCKED by the gateway, which calls no one
 * back: the bridge asks again every 200 ms, without holding the context,
 * until it gets the lock or the caller is interrupted. */
static int b_lock(const char *path, struct fuse_file_info *fi, int cmd, struct flock *lk)
{
	(void)path;
	CALLER;
	struct bridge_fh *f = (struct bridge_fh *)nfs_get_fh((struct nfsfh *)(uintptr_t)fi->fh);
	/* libnfs's nlm4_oh is a string: the owner in hex. */
	char oh[32];
	snprintf(oh, sizeof(oh), "%llx", (unsigned long long)fi->lock_owner);
	nlm4_lock l;
	memset(&l, 0, sizeof(l));
	l.caller_name = hostname;
	l.fh.data.data_len = f->len;
	l.fh.data.data_val = f->val;
	l.oh = oh;
	l.svid = (u_int)(fi->lock_owner ^ (fi->lock_owner >> 32));
	if (lk->l_start < 0 || lk->l_len < 0)
		return -EINVAL;
	l.l_offset = lk->l_start;
	l.l_len = lk->l_len;
	int excl = lk->l_type == F_WRLCK;

	if (cmd == F_GETLK) {
		NLM4_TESTargs a;
		memset(&a, 0, sizeof(a));
		a.exclusive = excl;
		a.lock = l;
		struct nlm_wait w = {0};
		if (rpc_nlm4_test_async(nlm, nlm_test_cb, &a, &w) != 0)
			return -EIO;
		int err = nlm_wait(&w);
		if (err)
			return err;
		if (w.stat == NLM4_GRANTED) {
			lk->l_type = F_UNLCK;
			return 0;
		}
		if (w.stat != NLM4_DENIED)
			return nlm_errno(w.stat);
		lk->l_type = w.holder.exclusive ? F_WRLCK : F_RDLCK;
		lk->l_whence = SEEK_SET;
		lk->l_start = w.holder.l_offset;
		lk->l_len = w.holder.l_len;
		lk->l_pid = w.holder.svid;
		return 0;
	}
	if (lk->l_type == F_UNLCK) {
		NLM4_UNLOCKargs a;
		memset(&a, 0, sizeof(a));
		a.lock = l;
		struct nlm_wait w = {0};
		if (rpc_nlm4_unlock_async(nlm, nlm_cb, &a, &w) != 0)
			return -EIO;
		int err = nlm_wait(&w);
		return err ? err : nlm_errno(w.stat);
	}
	for (;;) {
		NLM4_LOCKargs a;
		memset(&a, 0, sizeof(a));
		a.block = cmd == F_SETLKW;
		a.exclusive = excl;
		a.lock = l;
		a.state = 1;
		struct nlm_wait w = {0};
		if (rpc_nlm4_lock_async(nlm, nlm_cb, &a, &w) != 0)
			return -EIO;
		int err = nlm_wait(&w);
		if (err)
			return err;
		if (w.stat != NLM4_BLOCKED || cmd != F_SETLKW)
			return nlm_errno(w.stat);
		pthread_mutex_unlock(&big);
		usleep(200 * 1000);
		pthread_mutex_lock(&big);
		if (as_caller() != 0)
			return -EIO;
		if (fuse_interrupted())
			return -EINTR;
	}
}

static const struct fuse_operations ops = {
	.init = b_init,
	.getattr = b_getattr,
	.readlink = b_readlink,
	.mknod = b_mknod,
	.mkdir = b_mkdir,
	.unlink = b_unlink,
	.rmdir = b_rmdir,
	.symlink = b_symlink,
	.rename = b_rename,
	.link = b_link,
	.chmod = b_chmod,
	.chown = b_chown,
	.truncate = b_truncate,
	.utimens = b_utimens,
	.open = b_open,
	.create = b_create,
	.read = b_read,
	.write = b_write,
	.statfs = b_statfs,
	.release = b_release,
	.fsync = b_fsync,
	.readdir = b_readdir,
	.access = b_access,
	.lock = b_lock,
};

static void connect_cb(struct rpc_context *r, int status, void *data, void *priv)
{
	struct nlm_wait *w = priv;
	(void)r;
	(void)data;
	w->done = 1;
	w->status = status;
}

/* connect_nlm connects the NLM context to the gateway: on the URL's
 * nfsport (the gateway serves NLM on the NFS port), else where the
 * server's portmapper says. */
static int connect_nlm(const char *server, const char *url_s)
{
	if (gethostname(hostname, sizeof(hostname) - 1) != 0)
		strcpy(hostname, "nfsfuse");
	nlm = rpc_init_context();
	if (nlm == NULL)
		return -1;
	struct nlm_wait w = {0};
	const char *p = strstr(url_s, "nfsport=");
	int rc = p != NULL
		? rpc_connect_port_async(nlm, server, atoi(p + 8), NLM_PROGRAM, NLM_V4, connect_cb, &w)
		: rpc_connect_program_async(nlm, server, NLM_PROGRAM, NLM_V4, connect_cb, &w);
	if (rc != 0 || nlm_wait(&w) != 0) {
		fprintf(stderr, "nfsfuse: connecting to the lock manager (NLM v4) of %s: %s\n", server, rpc_get_error(nlm));
		return -1;
	}
	return 0;
}

int main(int argc, char **argv)
{
	if (argc < 3 || strncmp(argv[argc - 2], "nfs://", 6) != 0) {
		fprintf(stderr, "usage: nfsfuse [FUSE options] nfs://HOST/EXPORT?nfsport=P&mountport=P MOUNTPOINT\n");
		return 2;
	}
	const char *url_s = argv[argc - 2];
	nfs = nfs_init_context();
	if (nfs == NULL) {
		fprintf(stderr, "nfsfuse: nfs_init_context failed\n");
		return 1;
	}
	struct nfs_url *url = nfs_parse_url_dir(nfs, url_s);
	if (url == NULL) {
		fprintf(stderr, "nfsfuse: %s: %s\n", url_s, nfs_get_error(nfs));
		return 1;
	}
	if (nfs_mount(nfs, url->server, url->path) != 0) {
		fprintf(stderr, "nfsfuse: mount %s: %s\n", url_s, nfs_get_error(nfs));
		return 1;
	}
	if (connect_nlm(url->server, url_s) != 0)
		return 1;
	nfs_destroy_url(url);
	/* Modes are the caller's, already masked by the kernel. */
	nfs_umask(nfs, 0);
	rpc = nfs_get_rpc_context(nfs);

	struct nfsfh *root;
	if (nfs_open(nfs, "/", O_RDONLY, &root) != 0) {
		fprintf(stderr, "nfsfuse: open the export's root: %s\n", nfs_get_error(nfs));
		return 1;
	}
	struct bridge_fh *rf = (struct bridge_fh *)nfs_get_fh(root);
	if (rf->len <= 0 || rf->len > NFS3_FHSIZE) {
		fprintf(stderr, "nfsfuse: the root handle is %d bytes: this libnfs's struct nfs_fh is not the one this was built for\n", rf->len);
		return 1;
	}
	rootfh_len = rf->len;
	memcpy(rootfh, rf->val, rootfh_len);
	nfs_close(nfs, root);
	if (root_name_max() != 0) {
		fprintf(stderr, "nfsfuse: PATHCONF of the export's root failed\n");
		return 1;
	}

	/* FUSE gets argv without the URL; other users are allowed in
	 * (pjdfstest changes users). */
	char **fargv = calloc(argc + 4, sizeof(char *));
	int fargc = 0;
	for (int i = 0; i < argc; i++)
		if (i != argc - 2)
			fargv[fargc++] = argv[i];
	fargv[fargc++] = "-oallow_other,fsname=nfsfuse,subtype=nfsfuse";
	fargv[fargc] = NULL;
	int ret = fuse_main(fargc, fargv, &ops, NULL);
	nfs_destroy_context(nfs);
	return ret;
}
