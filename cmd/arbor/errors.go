package main

// The CLI's one error convention (issue 17): a failed command prints
//
//	arbor: what failed: why (what to try)
//
// The layers below wrap their errors with context, and the clients map
// their wire codes to sentinel errors where they can; what still reaches
// the CLI as text from gRPC ("rpc error: code = NotFound desc = ...") is
// put into plain words here, once, for every command. The raw error is
// logged at --log-level debug.

import (
	"context"
	"errors"
	"fmt"
	"regexp"
	"strings"

	"google.golang.org/grpc/codes"
)

// hinter is an error that knows what the user can do about it.
type hinter interface{ hint() string }

// grpcCodeWords are gRPC status codes in plain words, for a status whose
// description says nothing.
var grpcCodeWords = map[string]string{
	codes.Canceled.String():           "cancelled",
	codes.Unknown.String():            "failed",
	codes.InvalidArgument.String():    "invalid argument",
	codes.DeadlineExceeded.String():   "no answer in time",
	codes.NotFound.String():           "not found",
	codes.AlreadyExists.String():      "already exists",
	codes.PermissionDenied.String():   "permission denied",
	codes.ResourceExhausted.String():  "over a limit",
	codes.FailedPrecondition.String(): "not possible in the current state",
	codes.Aborted.String():            "conflict with another change; try again",
	codes.OutOfRange.String():         "out of range",
	codes.Unimplemented.String():      "not supported by this node (another version?)",
	codes.Internal.String():           "internal error",
	codes.Unavailable.String():        "unavailable",
	codes.DataLoss.String():           "data lost",
	codes.Unauthenticated.String():    "not authenticated",
}

// rpcErrorPrefix starts gRPC's text of a status error.
var rpcErrorPrefix = regexp.MustCompile(`rpc error: code = (\w+) desc = `)

// layerCode is a layer's name and its protobuf outcome code at the start
// of a description ("tract: BLOB_NOT_FOUND: "), which the plain words
// around it already say.
var layerCode = regexp.MustCompile(`\b([a-z]+): [A-Z][A-Z_]{2,}: `)

// Transport failures, as gRPC describes them, and their plain words.
var transportWords = []struct{ contains, words string }{
	{"connection refused", "connection refused"},
	{"frame too large", "the address answers HTTP/1.1, not gRPC"},
	{"no such host", "no such host"},
	{"i/o timeout", "connection timed out"},
	{"network is unreachable", "network unreachable"},
	{"connection reset", "connection reset"},
}

// describeError is the line a failed command prints (after "arbor: ").
func describeError(err error) string {
	msg := plainWords(err.Error())
	if h := errorHint(err, msg); h != "" && !strings.Contains(msg, h) {
		msg += " (" + h + ")"
	}
	return msg
}

// plainWords rewrites every gRPC status text in msg into plain words:
// its description without the code, or the code in words if the
// description is empty; a transport failure by what it was.
func plainWords(msg string) string {
	for {
		loc := rpcErrorPrefix.FindStringSubmatchIndex(msg)
		if loc == nil {
			break
		}
		code := msg[loc[2]:loc[3]]
		end := descEnd(msg, loc[1])
		desc := msg[loc[1]:end]
		words := strings.TrimSpace(desc)
		if code == codes.Unavailable.String() || strings.HasPrefix(words, "connection error") {
			words = grpcCodeWords[codes.Unavailable.String()]
			for _, t := range transportWords {
				if strings.Contains(desc, t.contains) {
					words = t.words
					break
				}
			}
		}
		if words == "" {
			words = grpcCodeWords[code]
		}
		msg = msg[:loc[0]] + words + msg[end:]
	}
	msg = strings.ReplaceAll(msg, context.DeadlineExceeded.Error(), "timed out")
	return layerCode.ReplaceAllStringFunc(msg, func(m string) string {
		// "tract: BLOB_NOT_FOUND: blob x does not exist" says it twice.
		return m[:strings.Index(m, ":")+2]
	})
}

// descEnd finds where a gRPC description that starts at i in msg ends:
// at the end of msg, or before the parenthesis that closes a group it was
// quoted in ("(last error from host: rpc error: ...)").
func descEnd(msg string, i int) int {
	depth := 0
	for j := i; j < len(msg); j++ {
		switch msg[j] {
		case '(':
			depth++
		case ')':
			if depth == 0 {
				return j
			}
			depth--
		}
	}
	return len(msg)
}

// errorHint names what the user can try about err, or "".
func errorHint(err error, msg string) string {
	var h hinter
	if errors.As(err, &h) {
		return h.hint()
	}
	switch {
	case strings.Contains(msg, "answers HTTP/1.1, not gRPC"):
		return (&notGRPCError{}).hint()
	case strings.Contains(msg, "connection refused"):
		return (&unreachableError{}).hint()
	case errors.Is(err, context.DeadlineExceeded) || strings.Contains(msg, "timed out"):
		return "the cluster did not answer within --timeout; arbor status shows whether it is healthy, a longer --timeout waits more"
	}
	return ""
}

// reportError prints a failed command's error by the convention above,
// the raw error first at --log-level debug.
func (a *app) reportError(err error) {
	if a.logger != nil {
		a.logger.Debug("command failed", "err", err)
	}
	fmt.Fprintf(a.stderr, "arbor: %s\n", describeError(err))
}
