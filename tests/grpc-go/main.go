// grpc-go-unary: one call with grpc-go (HTTP/2, no proxy), request and
// replies as raw protobuf bytes in hex (no generated code), for rrpc's
// integration tests, which call an `rrpc://` port with it (`one_port`
// plaintext, `tls` with TLS credentials):
//
//	grpc-go-unary [-stream] [-ca FILE [-cert FILE -key FILE] [-server-name NAME]] ADDR /pkg.Service/Method HEX
//
// A unary call prints the reply's bytes in hex; with -stream the call is
// server streaming and each reply is printed on a line of its own. With
// -ca the channel has TLS credentials (grpc-go's `credentials.NewTLS`)
// trusting the CA in FILE (PEM), with -cert/-key presenting that client
// certificate, and checking the server's certificate for -server-name
// (default: ADDR's host). Without -ca it is plaintext. On a failed call,
// its status on stderr and exit status 1.
package main

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"encoding/hex"
	"errors"
	"flag"
	"fmt"
	"io"
	"net"
	"os"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials"
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

func usage() {
	fmt.Fprintln(os.Stderr, "usage: grpc-go-unary [-stream] [-ca FILE [-cert FILE -key FILE] [-server-name NAME]] ADDR /pkg.Service/Method HEX")
	os.Exit(2)
}

// transport is plaintext without a CA, else TLS trusting it.
func transport(addr, ca, cert, key, name string) (credentials.TransportCredentials, error) {
	if ca == "" {
		if cert != "" || key != "" || name != "" {
			return nil, errors.New("-cert, -key and -server-name need -ca")
		}
		return insecure.NewCredentials(), nil
	}
	pem, err := os.ReadFile(ca)
	if err != nil {
		return nil, err
	}
	roots := x509.NewCertPool()
	if !roots.AppendCertsFromPEM(pem) {
		return nil, fmt.Errorf("%s: no PEM certificate", ca)
	}
	if name == "" {
		host, _, err := net.SplitHostPort(addr)
		if err != nil {
			return nil, err
		}
		name = host
	}
	c := &tls.Config{RootCAs: roots, ServerName: name, MinVersion: tls.VersionTLS12}
	if cert != "" || key != "" {
		pair, err := tls.LoadX509KeyPair(cert, key)
		if err != nil {
			return nil, err
		}
		c.Certificates = []tls.Certificate{pair}
	}
	return credentials.NewTLS(c), nil
}

func main() {
	stream := flag.Bool("stream", false, "a server-streaming call (one reply a line)")
	ca := flag.String("ca", "", "TLS: the CA to trust (PEM file); plaintext without it")
	cert := flag.String("cert", "", "TLS: the client's certificate (PEM file)")
	key := flag.String("key", "", "TLS: the client's private key (PEM file)")
	name := flag.String("server-name", "", "TLS: the name the server's certificate must carry")
	flag.Usage = usage
	flag.Parse()
	if flag.NArg() != 3 {
		usage()
	}
	addr, method := flag.Arg(0), flag.Arg(1)
	req, err := hex.DecodeString(flag.Arg(2))
	if err != nil {
		fmt.Fprintln(os.Stderr, "request:", err)
		os.Exit(2)
	}
	creds, err := transport(addr, *ca, *cert, *key, *name)
	if err != nil {
		fmt.Fprintln(os.Stderr, "credentials:", err)
		os.Exit(2)
	}
	// passthrough: the address as given (no DNS); no proxy from the
	// environment.
	conn, err := grpc.NewClient("passthrough:///"+addr,
		grpc.WithTransportCredentials(creds),
		grpc.WithNoProxy(),
		grpc.WithDefaultCallOptions(grpc.ForceCodecV2(raw{})))
	if err != nil {
		fmt.Fprintln(os.Stderr, "client:", err)
		os.Exit(1)
	}
	defer conn.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	if !*stream {
		var reply []byte
		if err := conn.Invoke(ctx, method, &req, &reply); err != nil {
			fmt.Fprintln(os.Stderr, "call:", err)
			os.Exit(1)
		}
		fmt.Println(hex.EncodeToString(reply))
		return
	}
	s, err := conn.NewStream(ctx, &grpc.StreamDesc{ServerStreams: true}, method)
	if err == nil {
		err = s.SendMsg(&req)
	}
	if err == nil {
		err = s.CloseSend()
	}
	for err == nil {
		var reply []byte
		if err = s.RecvMsg(&reply); err == nil {
			fmt.Println(hex.EncodeToString(reply))
		}
	}
	if !errors.Is(err, io.EOF) {
		fmt.Fprintln(os.Stderr, "call:", err)
		os.Exit(1)
	}
}
