// grpc-go-unary: one unary call with grpc-go (plaintext HTTP/2, no proxy),
// request and reply as raw protobuf bytes in hex (no generated code), for
// rrpc's `one_port` integration test, which calls an `rrpc://` port with it:
//
//	grpc-go-unary ADDR /pkg.Service/Method HEX
//
// prints the reply's bytes in hex; on a failed call, its status on stderr
// and exit status 1.
package main

import (
	"context"
	"encoding/hex"
	"fmt"
	"os"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/mem"
)

// raw passes a message's bytes through unchanged: the caller encodes them.
type raw struct{}

func (raw) Name() string { return "proto" }

func (raw) Marshal(v any) (mem.BufferSlice, error) {
	b, ok := v.(*[]byte)
	if !ok {
		return nil, fmt.Errorf("raw codec: cannot marshal %T", v)
	}
	return mem.BufferSlice{mem.SliceBuffer(*b)}, nil
}

func (raw) Unmarshal(data mem.BufferSlice, v any) error {
	b, ok := v.(*[]byte)
	if !ok {
		return fmt.Errorf("raw codec: cannot unmarshal into %T", v)
	}
	*b = data.Materialize()
	return nil
}

func main() {
	if len(os.Args) != 4 {
		fmt.Fprintln(os.Stderr, "usage: grpc-go-unary ADDR /pkg.Service/Method HEX")
		os.Exit(2)
	}
	addr, method := os.Args[1], os.Args[2]
	req, err := hex.DecodeString(os.Args[3])
	if err != nil {
		fmt.Fprintln(os.Stderr, "request:", err)
		os.Exit(2)
	}
	// passthrough: the address as given (no DNS); no proxy from the
	// environment.
	conn, err := grpc.NewClient("passthrough:///"+addr,
		grpc.WithTransportCredentials(insecure.NewCredentials()),
		grpc.WithNoProxy(),
		grpc.WithDefaultCallOptions(grpc.ForceCodecV2(raw{})))
	if err != nil {
		fmt.Fprintln(os.Stderr, "client:", err)
		os.Exit(1)
	}
	defer conn.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	var reply []byte
	if err := conn.Invoke(ctx, method, &req, &reply); err != nil {
		fmt.Fprintln(os.Stderr, "call:", err)
		os.Exit(1)
	}
	fmt.Println(hex.EncodeToString(reply))
}
