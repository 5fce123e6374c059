// Runs Apache Kafka's command-line tools one after another in this one JVM, for
// oncelog.harness.apache_kafka.KafkaTools. Each line on stdin names a job directory holding
// "args" (the main class, then the tool's arguments, NUL-separated) and "stdin"; the tool's
// output goes to the directory's "stdout" and "stderr", and its exit code is the line this
// writes back on stdout. Exit.exit and Exit.halt (how Kafka's tools end) are caught, so the
// JVM goes on to the next job.

import java.io.BufferedReader;
import java.io.FileInputStream;
import java.io.FileOutputStream;
import java.io.InputStream;
import java.io.InputStreamReader;
import java.io.OutputStream;
import java.io.PrintStream;
import java.lang.reflect.InvocationTargetException;
import java.lang.reflect.Method;
import java.nio.charset.StandardCharsets;
import java.nio.file.Files;
import java.nio.file.Path;
import java.util.Arrays;

import org.apache.kafka.common.utils.Exit;

public final class KafkaToolRunner {
    private static final class ToolExit extends RuntimeException {
        final int code;

        ToolExit(int code) {
            super(null, null, false, false);
            this.code = code;
        }
    }

    private static final PrintStream NOWHERE = new PrintStream(OutputStream.nullOutputStream());
    private static volatile Integer firstExit;

    private static void exited(int code) {
        if (firstExit == null) {
            firstExit = code;
            System.out.flush();
            System.err.flush();
            System.setOut(NOWHERE);
            System.setErr(NOWHERE);
        }
        throw new ToolExit(code);
    }

    public static void main(String[] argv) throws Exception {
        PrintStream reply = System.out;
        InputStream realIn = System.in;
        BufferedReader jobs = new BufferedReader(new InputStreamReader(realIn, StandardCharsets.UTF_8));
        // The first Exit.exit ends the tool, as it would end its process: its code is the
        // tool's, and what the tool prints after it (a catch-all around its body that sees the
        // ToolExit thrown here, say) goes nowhere.
        Exit.setExitProcedure((code, message) -> exited(code));
        Exit.setHaltProcedure((code, message) -> exited(code));
        // A tool's shutdown hooks (the console producer closes its producer, delivering what it
        // still holds, in one) run when the tool ends, as they would when its process exits.
        Exit.setShutdownHookAdder((name, hook) -> HOOKS.add(hook));
        String line;
        while ((line = jobs.readLine()) != null) {
            Path job = Path.of(line.trim());
            String[] all = new String(Files.readAllBytes(job.resolve("args")), StandardCharsets.UTF_8)
                .split("\0", -1);
            int code;
            try (InputStream in = new FileInputStream(job.resolve("stdin").toFile());
                 PrintStream out = new PrintStream(new FileOutputStream(job.resolve("stdout").toFile()), true,
                     StandardCharsets.UTF_8);
                 PrintStream err = new PrintStream(new FileOutputStream(job.resolve("stderr").toFile()), true,
                     StandardCharsets.UTF_8)) {
                System.setIn(in);
                System.setOut(out);
                System.setErr(err);
                firstExit = null;
                HOOKS.clear();
                code = run(all[0], Arrays.copyOfRange(all, 1, all.length), err);
                // the hooks print where the tool printed (its exit sent its later output nowhere)
                System.setOut(out);
                System.setErr(err);
                runShutdownHooks();
                if (firstExit != null) {
                    code = firstExit;
                }
                out.flush();
                err.flush();
            } finally {
                // Between tools, what a finished tool's leftover threads print (a client's
                // warnings as it reconnects) goes nowhere, as after its process's end: never
                // into the replies on this JVM's stdout.
                System.setIn(realIn);
                System.setOut(NOWHERE);
                System.setErr(NOWHERE);
            }
            reply.println(code);
            reply.flush();
        }
    }

    private static final java.util.List<Runnable> HOOKS = new java.util.concurrent.CopyOnWriteArrayList<>();

    private static void runShutdownHooks() {
        java.util.List<Thread> threads = new java.util.ArrayList<>();
        for (Runnable hook : HOOKS) {
            Thread t = new Thread(() -> {
                try {
                    hook.run();
                } catch (Throwable ignored) {
                    // as in a JVM shutting down: a failing hook does not stop the others
                }
            }, "tool-shutdown-hook");
            t.setDaemon(true);
            t.start();
            threads.add(t);
        }
        for (Thread t : threads) {
            try {
                t.join(30_000);
            } catch (InterruptedException e) {
                Thread.currentThread().interrupt();
            }
        }
        HOOKS.clear();
    }

    private static int run(String mainClass, String[] args, PrintStream err) {
        try {
            Method main = Class.forName(mainClass).getMethod("main", String[].class);
            main.invoke(null, (Object) args);
            return 0;
        } catch (InvocationTargetException e) {
            Throwable cause = e.getCause();
            if (cause instanceof ToolExit) {
                return ((ToolExit) cause).code;
            }
            // as the JVM would: an uncaught exception from main is printed, and the exit code is 1
            err.print("Exception in thread \"main\" ");
            cause.printStackTrace(err);
            return 1;
        } catch (ToolExit e) {
            return e.code;
        } catch (ReflectiveOperationException e) {
            e.printStackTrace(err);
            return 127;
        }
    }
}
