package rendezvous

import (
	"bytes"
	"crypto/hmac"
	"crypto/rand"
	"crypto/sha256"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"strconv"
	"strings"
	"unicode"
	"unicode/utf8"
)

// The wire: frames, the handshake's messages, the proofs of the token and
// the authentication codes of the frames after the handshake.

// Frame types.
const (
	frameHello byte = iota + 1
	frameReject
	frameStart
	frameData
	frameBarrier
	frameRelease
	frameAbort
	frameBye
	frameChallenge
	frameWelcome
	frameGather
	frameGathered
	frameRoll
	framePresent
)

var frameNames = map[byte]string{frameHello: "hello", frameReject: "reject", frameStart: "start", frameData: "data",
	frameBarrier: "barrier", frameRelease: "release", frameAbort: "abort", frameBye: "bye",
	frameChallenge: "challenge", frameWelcome: "welcome", frameGather: "gather", frameGathered: "gathered",
	frameRoll: "roll call", framePresent: "present"}

func frameName(t byte) string {
	if n, ok := frameNames[t]; ok {
		return n
	}
	return fmt.Sprintf("type %d", t)
}

const (
	magic    = "SGRV"
	version  = 3
	nonceLen = 32
	proofLen = sha256.Size
	macLen   = sha256.Size

	challengeLen = len(magic) + 1 + nonceLen
	helloLen     = len(magic) + 1 + 4 + 4 + nonceLen + proofLen
	// maxHello bounds what rank 0 reads from a connection before it knows
	// that the peer holds the token: a hello is helloLen bytes, and the
	// margin lets a hello of an older protocol with a short token be read
	// and answered with the version rank 0 speaks. Greetings are read
	// concurrently, so this bounds memory too. A rank reads rank 0's
	// challenge and its answer to the hello with the same bound: until
	// rank 0 has proved the token it may be anyone.
	maxHello = 1024
	// maxPeerText bounds the text of a peer (a reason for a reject or an
	// abort) that an error or a log line quotes.
	maxPeerText = 256
	// maxReason bounds the reason an abort carries.
	maxReason = 4096
)

// notAuthenticated is the whole reason given to a peer whose hello does not
// prove the token: a stranger learns nothing about the job from it.
const notAuthenticated = "not authenticated"

type frame struct {
	typ  byte
	body []byte
}

// writeFrame writes one frame, of type typ, whose body is the
// concatenation of parts (a payload and its authentication code).
func writeFrame(w io.Writer, typ byte, parts ...[]byte) error {
	n := 0
	for _, p := range parts {
		n += len(p)
	}
	buf := make([]byte, 5, 5+n)
	binary.BigEndian.PutUint32(buf, uint32(1+n))
	buf[4] = typ
	for _, p := range parts {
		buf = append(buf, p...)
	}
	_, err := w.Write(buf)
	return err
}

// readFrame reads one frame whose payload is at most max bytes.
func readFrame(r io.Reader, max int) (frame, error) {
	var hdr [4]byte
	if _, err := io.ReadFull(r, hdr[:]); err != nil {
		return frame{}, err
	}
	n := binary.BigEndian.Uint32(hdr[:])
	if n == 0 || uint64(n) > uint64(max)+1 {
		return frame{}, fmt.Errorf("%w: frame of %d bytes (at most %d)", ErrMalformed, n, max+1)
	}
	buf := make([]byte, n)
	if _, err := io.ReadFull(r, buf); err != nil {
		if errors.Is(err, io.EOF) {
			err = io.ErrUnexpectedEOF
		}
		return frame{}, err
	}
	return frame{typ: buf[0], body: buf[1:]}, nil
}

// nonce returns nonceLen random bytes.
func nonce() ([]byte, error) {
	n := make([]byte, nonceLen)
	if _, err := rand.Read(n); err != nil {
		return nil, fmt.Errorf("rendezvous: random nonce: %w", err)
	}
	return n, nil
}

// challenge is rank 0's first message on every connection: the protocol and
// a fresh nonce the peer's proof must cover (so that a recorded hello cannot
// be replayed). It says nothing about the job.
type challenge struct {
	version byte
	nonce   []byte
}

func (c challenge) encode() []byte {
	return append(append([]byte(magic), c.version), c.nonce...)
}

func decodeChallenge(body []byte) (challenge, error) {
	if len(body) < len(magic)+1 || string(body[:len(magic)]) != magic {
		return challenge{}, fmt.Errorf("%w: not a rendezvous challenge", ErrMalformed)
	}
	c := challenge{version: body[len(magic)]}
	if c.version != version {
		return c, nil // the caller reports the version
	}
	if len(body) != challengeLen {
		return challenge{}, fmt.Errorf("%w: challenge of %d bytes, want %d", ErrMalformed, len(body), challengeLen)
	}
	c.nonce = body[len(magic)+1:]
	return c, nil
}

// hello is what a rank says in answer to the challenge: who it is, its own
// nonce (which rank 0's proof in welcome covers), and its proof of the
// token over both nonces, the world and the rank. The token itself never
// travels.
type hello struct {
	version     byte
	world, rank uint32
	nonce       []byte
	proof       []byte
}

func (h hello) encode() []byte {
	var b bytes.Buffer
	b.WriteString(magic)
	b.WriteByte(h.version)
	binary.Write(&b, binary.BigEndian, h.world)
	binary.Write(&b, binary.BigEndian, h.rank)
	b.Write(h.nonce)
	b.Write(h.proof)
	return b.Bytes()
}

// decodeHello decodes a hello. A hello of another version is returned with
// only its version set, for the caller to refuse.
func decodeHello(body []byte) (hello, error) {
	if len(body) < len(magic)+1 || string(body[:len(magic)]) != magic {
		return hello{}, fmt.Errorf("%w: not a rendezvous hello", ErrMalformed)
	}
	b := body[len(magic):]
	if b[0] != version {
		return hello{version: b[0]}, nil
	}
	if len(body) != helloLen {
		return hello{}, fmt.Errorf("%w: not a rendezvous hello", ErrMalformed)
	}
	return hello{version: b[0], world: binary.BigEndian.Uint32(b[1:]), rank: binary.BigEndian.Uint32(b[5:]),
		nonce: b[9 : 9+nonceLen], proof: b[9+nonceLen:]}, nil
}

// Roles of a proof: a rank proves itself to rank 0 in its hello, rank 0
// proves itself to the rank in welcome. The label keeps one from standing
// for the other. The same construction, with the labels of the two
// directions, makes the keys of a connection's frames after the
// handshake.
const (
	roleRank = "rank"
	roleRoot = "rank 0"

	keyToRank = "frames from rank 0 to the rank"
	keyToRoot = "frames from the rank to rank 0"
)

// proof is HMAC-SHA256, keyed by the token's SHA-256, of the role, both
// nonces, the world and the rank. Proofs are compared with hmac.Equal, in
// constant time. (Hashing the token first keeps tokens that differ only by
// trailing NUL bytes apart: HMAC pads a short key with zeros.)
func proof(token, role string, rootNonce, rankNonce []byte, world, rank uint32) []byte {
	key := sha256.Sum256([]byte(token))
	m := hmac.New(sha256.New, key[:])
	m.Write([]byte("stablegraph rendezvous v" + strconv.Itoa(version) + "\x00" + role + "\x00"))
	m.Write(rootNonce)
	m.Write(rankNonce)
	var wr [8]byte
	binary.BigEndian.PutUint32(wr[:], world)
	binary.BigEndian.PutUint32(wr[4:], rank)
	m.Write(wr[:])
	return m.Sum(nil)
}

// sessionKeys are the keys of the frames of one connection after its
// handshake, one per direction: they hang on the token and on both of the
// connection's nonces, so a frame of one connection (or one direction)
// does not check on another.
func sessionKeys(token string, rootNonce, rankNonce []byte, world, rank uint32) (toRank, toRoot []byte) {
	return proof(token, keyToRank, rootNonce, rankNonce, world, rank), proof(token, keyToRoot, rootNonce, rankNonce, world, rank)
}

// frameMAC is a frame's authentication code: HMAC-SHA256, keyed by its
// direction's key, of its sequence number on the connection (0 for the
// first frame after welcome), its type and its payload. The number makes
// a frame replayed, dropped or moved fail the next check.
func frameMAC(key []byte, seq uint64, typ byte, payload []byte) []byte {
	m := hmac.New(sha256.New, key)
	var hdr [9]byte
	binary.BigEndian.PutUint64(hdr[:], seq)
	hdr[8] = typ
	m.Write(hdr[:])
	m.Write(payload)
	return m.Sum(nil)
}

// peerText makes text a peer sent fit to quote in an error or a log line:
// control characters, escape codes and bytes that are not UTF-8 are
// escaped as Go escapes them (\x1b, \n, \xff), and it is cut at limit
// bytes (maxPeerText for a peer not authenticated, maxReason for a rank's
// abort), saying how many more there were.
func peerText(b []byte, limit int) string {
	more := 0
	if len(b) > limit {
		more, b = len(b)-limit, b[:limit]
	}
	var s strings.Builder
	for len(b) > 0 {
		r, n := utf8.DecodeRune(b)
		switch {
		case r == utf8.RuneError && n <= 1:
			fmt.Fprintf(&s, "\\x%02x", b[0])
		case r == '\\' || !unicode.IsPrint(r) && r != ' ':
			q := strconv.QuoteRune(r)
			s.WriteString(q[1 : len(q)-1])
		default:
			s.WriteRune(r)
		}
		b = b[n:]
	}
	if more > 0 {
		fmt.Fprintf(&s, "... (%d more bytes)", more)
	}
	return s.String()
}

// encodeParts encodes the contributions of AllGather: a count, then each
// part as a length and its bytes.
func encodeParts(parts [][]byte) []byte {
	n := 4
	for _, p := range parts {
		n += 4 + len(p)
	}
	b := make([]byte, 0, n)
	b = binary.BigEndian.AppendUint32(b, uint32(len(parts)))
	for _, p := range parts {
		b = binary.BigEndian.AppendUint32(b, uint32(len(p)))
		b = append(b, p...)
	}
	return b
}

// partsLen is the length of encodeParts' result for parts of these lengths.
func partsLen(lens ...int) int {
	n := 4
	for _, l := range lens {
		n += 4 + l
	}
	return n
}

func decodeParts(b []byte, want int) ([][]byte, error) {
	bad := fmt.Errorf("%w: gathered data of %d bytes is not %d parts", ErrMalformed, len(b), want)
	if len(b) < 4 || int(binary.BigEndian.Uint32(b)) != want {
		return nil, bad
	}
	b = b[4:]
	parts := make([][]byte, want)
	for i := range parts {
		if len(b) < 4 {
			return nil, bad
		}
		n := binary.BigEndian.Uint32(b)
		b = b[4:]
		if uint64(n) > uint64(len(b)) {
			return nil, bad
		}
		parts[i], b = b[:n:n], b[n:]
	}
	if len(b) != 0 {
		return nil, bad
	}
	return parts, nil
}
